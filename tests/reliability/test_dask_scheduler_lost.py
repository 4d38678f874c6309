"""A Dask scheduler lost in the middle of a build: killed (its connection closes) or frozen (SIGSTOP,
as a hung host or a cut network: nothing closes, nothing answers). Either way the client gives up
within a bounded time, exit 1, naming the scheduler and saying what to do, instead of waiting forever.

The scheduler and its worker are processes of this test (not the shared module cluster), so they can
be killed; the worker holds the optimize stage at the test plugin's gate while the scheduler goes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("distributed")

from dask_cluster import GATE_ENV, edgebuild, gate_pids, start_edgebuild, wait_for  # noqa: E402

GATED = "optimize: {passes: {test_noop: true}}\n"  # the pass that waits at the gate when armed
TIMEOUT_ENV = "EDGEBUILD_DASK_TIMEOUT"
HANG_BOUND = 120  # seconds: only there so a hang fails the test; the client is told 3


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def lone_cluster(tmp_path):
    """A scheduler process and one worker process on 127.0.0.1 (the worker inherits the gate):
    ``(scheduler process, address, gate)``. Both are ended after the test, a frozen one resumed first."""
    from distributed import Client

    gate = tmp_path / "gate"
    gate.mkdir()
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    logs = tmp_path / "cluster.log"
    env = {**os.environ, GATE_ENV: str(gate)}
    with logs.open("w") as log:
        scheduler = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                      "--port", str(port), "--no-dashboard"], stdout=log, stderr=log, env=env)
        worker = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address, "--host", "127.0.0.1",
                                   "--nthreads", "1", "--no-nanny", "--no-dashboard"], stdout=log, stderr=log, env=env)
    try:
        def one_worker():
            try:
                with Client(address, timeout=5) as client:
                    return len(client.scheduler_info()["workers"]) >= 1
            except OSError:
                return False

        wait_for(one_worker, "the scheduler and its worker to start", 120)
        yield scheduler, address, gate
    finally:
        for process in (worker, scheduler):
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
            process.wait(timeout=30)


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_a_lost_scheduler_fails_the_build_naming_it(project, lone_cluster, tmp_path, monkeypatch, how):
    scheduler, address, gate = lone_cluster
    recipe = project(GATED)
    (gate / "armed").touch()
    monkeypatch.setenv(TIMEOUT_ENV, "3")
    run = start_edgebuild("run", recipe, "--executor", "dask://" + address.removeprefix("tcp://"), "--json",
                          cwd=tmp_path, cache=tmp_path / "store")
    try:
        wait_for(lambda: gate_pids(gate) or run.poll() is not None, "the optimize stage to start on the worker")
        assert run.poll() is None, run.communicate()[1]
        scheduler.send_signal(signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        lost_at = time.monotonic()
        out, err = run.communicate(timeout=HANG_BOUND)
    finally:
        run.kill()
    assert time.monotonic() - lost_at < HANG_BOUND
    assert run.returncode == 1, err
    assert f"lost the Dask scheduler at {address}" in err, err
    assert ("connection to it closed" if how == "killed" else "has not answered") in err, err
    assert "run the build again" in err and TIMEOUT_ENV in err
    assert "Traceback" not in err and "internal error" not in err, err
    # --json still speaks for every variant: the one the scheduler took with it failed, with the reason
    [variant] = json.loads(out)["variants"]
    assert variant["status"] == "failed"
    assert "lost the Dask scheduler" in json.dumps(variant)


@pytest.mark.parametrize("value", ["abc", "0", "-5", "nan", "inf"])
def test_a_bad_timeout_is_a_usage_error_before_connecting(project, tmp_path, monkeypatch, value):
    monkeypatch.setenv(TIMEOUT_ENV, value)
    done = edgebuild("run", project(), "--executor", f"dask://127.0.0.1:{free_port()}", cwd=tmp_path,
                     cache=tmp_path / "store")
    assert done.returncode == 2, done.stderr
    assert f"{TIMEOUT_ENV}={value!r}" in done.stderr and "seconds above 0" in done.stderr
    assert "cannot reach" not in done.stderr  # refused before any connection was tried
