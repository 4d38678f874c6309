"""A real Dask cluster for the distributed-build tests: a scheduler and two worker processes
(one thread each) on 127.0.0.1, started once per test module, and helpers to compare runs."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

GATE_ENV = "EDGEBUILD_TEST_GATE"  # the test plugin's test_noop pass waits at this folder when armed


@dataclass
class Cluster:
    address: str  # tcp://127.0.0.1:PORT
    gate: Path

    @property
    def executor(self) -> str:
        return "dask://" + self.address.removeprefix("tcp://")

    def tasks_on_scheduler(self) -> list[str]:
        from distributed import Client

        with Client(self.address, timeout=10) as client:
            return client.run_on_scheduler(lambda dask_scheduler: [str(k) for k in dask_scheduler.tasks])

    def worker_pids(self) -> set[int]:
        from distributed import Client

        with Client(self.address, timeout=10) as client:
            return set(client.run(os.getpid).values())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    distributed = pytest.importorskip("distributed")
    gate = tmp_path_factory.mktemp("gate")
    previous = os.environ.get(GATE_ENV)
    os.environ[GATE_ENV] = str(gate)  # before the workers start: they inherit it
    try:
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                      dashboard_address=":0", protocol="tcp") as local:
            yield Cluster(local.scheduler_address, gate)
    finally:
        if previous is None:
            os.environ.pop(GATE_ENV, None)
        else:
            os.environ[GATE_ENV] = previous


@pytest.fixture
def gate(cluster):
    """The cluster's gate, closed and disarmed again after the test (so no worker stays held)."""
    yield cluster.gate
    (cluster.gate / "open").touch()
    # A worker polls for `open`: removed at once, a worker still held would never see it and stay
    # busy for the next test. Wait until each held worker has left (or was killed).
    wait_for(lambda: all(not is_alive(pid) or (cluster.gate / f"left-{pid}").exists()
                         for pid in gate_pids(cluster.gate)), "the held workers to leave the gate", 60)
    for path in cluster.gate.iterdir():
        if path.name != "open":
            path.unlink()
    (cluster.gate / "open").unlink()


def edgebuild(*args, cwd: Path, cache: Path) -> subprocess.CompletedProcess:
    """``edgebuild ARGS`` in a subprocess, as a user runs it, with its own store."""
    env = {**os.environ, "EDGEBUILD_CACHE_DIR": str(cache)}
    return subprocess.run([sys.executable, "-m", "edgebuild.cli.app", *map(str, args)], capture_output=True,
                          text=True, env=env, cwd=cwd)


def start_edgebuild(*args, cwd: Path, cache: Path) -> subprocess.Popen:
    env = {**os.environ, "EDGEBUILD_CACHE_DIR": str(cache)}
    return subprocess.Popen([sys.executable, "-m", "edgebuild.cli.app", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)


def interrupt(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGINT)


def summary(done: subprocess.CompletedProcess, normalise=None) -> dict[str, dict]:
    """What ``run --json`` built, read at once (the next run replaces the output folders): per
    variant its stages' names and keys and statuses, and its artifacts' digests."""
    assert done.returncode == 0, done.stderr
    variants = json.loads(done.stdout)["variants"]
    return {f"{v['recipe']}:{v['variant']}": {
        "keys": [(s["name"], s["key"]) for s in v["stages"]],
        "statuses": [s["status"] for s in v["stages"]],
        "artifacts": [tree_digest(a, normalise) for a in v["artifacts"]],
    } for v in variants}


def tree_digest(path, normalise=None) -> str:
    """sha256 over a file's or folder's relative paths and contents (``normalise(file) -> bytes``,
    if given, reads a file)."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    digest = hashlib.sha256()
    for file in files:
        digest.update(str(file.relative_to(path) if file != path else file.name).encode() + b"\0")
        digest.update(hashlib.sha256(normalise(file) if normalise else file.read_bytes()).digest())
    return digest.hexdigest()


def same_builds(local: dict[str, dict], distributed: dict[str, dict]) -> None:
    """The two runs built the same variants: same stage keys, same artifacts byte for byte."""
    assert sorted(local) == sorted(distributed)
    for label, want in local.items():
        differ = [(w[0], w[1][:12], g[1][:12]) for w, g in zip(want["keys"], distributed[label]["keys"]) if w != g]
        assert distributed[label]["keys"] == want["keys"], f"{label}: stage, local key, cluster key: {differ}"
        assert distributed[label]["artifacts"] == want["artifacts"], label
        assert want["artifacts"], label


def wait_for(condition, what: str, seconds: float = 120.0):
    """Poll until ``condition()`` is truthy; a deadline only so a broken run fails instead of hanging."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def gate_pids(gate: Path) -> list[int]:
    return [int(p.name.removeprefix("running-")) for p in gate.glob("running-*")]


def is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
