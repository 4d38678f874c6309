"""``edgebuild run --executor dask://HOST:PORT`` on a real Dask cluster (a scheduler and two worker
processes on 127.0.0.1) with the test plugin's copying backend: the same builds as the local
executor, a killed worker's stage run again elsewhere, Ctrl-C, an unreachable scheduler."""

from __future__ import annotations

import json
import re
import socket

import pytest

pytest.importorskip("distributed")

from dask_cluster import (  # noqa: E402
    cluster,  # noqa: F401  (the module's cluster fixture)
    edgebuild,
    gate,  # noqa: F401
    gate_pids,
    interrupt,
    is_alive,
    same_builds,
    start_edgebuild,
    summary,
    wait_for,
)

# two variants sharing import, optimize and lower (package differs): one task each on the cluster
VARIANTS = """\
variants:
  a: {}
  b: {}
"""
GATED = "optimize: {passes: {test_noop: true}}\n"  # the pass that waits at the cluster's gate when armed


def progress_lines(stderr: str) -> list[str]:
    """The per-stage lines, timings taken out, in a stable order (stages of different variants interleave);
    the summary table's rows (a variant, then its status) are not progress."""
    lines = [re.sub(r"\d+(\.\d+)?\s*m?s\b", "T", line).rstrip() for line in stderr.splitlines()]
    # "resolve started" says a source was hashed, which depends on what each machine remembers
    return sorted(line for line in lines if line.startswith(("tiny:", "other:"))
                  and not re.match(r"\S+\s+(validation (passed|failed)|built, not validated|error)\s", line) and not re.match(r"\S+\s+resolve\s+started", line))


def test_cluster_builds_what_the_local_executor_builds(project, cluster, tmp_path):
    first = project(VARIANTS)
    second = tmp_path / "other.yaml"
    second.write_text(first.read_text().replace("name: tiny", "name: other").replace("{dir: out}", "{dir: out2}"))

    local = edgebuild("run", first, second, "-j", "1", "--json", cwd=tmp_path, cache=tmp_path / "local-store")
    on_cluster = edgebuild("run", first, second, "--executor", cluster.executor, "--json", cwd=tmp_path,
                           cache=tmp_path / "cluster-store")

    same_builds(summary(local), summary(on_cluster))
    # a stage two variants share ran once, as locally; the second variant reports it cached
    assert summary(on_cluster)["tiny:b"]["statuses"] == summary(local)["tiny:b"]["statuses"]
    assert progress_lines(on_cluster.stderr) == progress_lines(local.stderr)
    assert any(" started" in line for line in progress_lines(on_cluster.stderr))


def test_a_failing_stage_fails_its_variant_as_locally(project, cluster, tmp_path):
    recipe = project()
    (tmp_path / "tiny.onnx").write_bytes(b"not an ONNX model")
    local = edgebuild("run", recipe, cwd=tmp_path, cache=tmp_path / "local-store")
    on_cluster = edgebuild("run", recipe, "--executor", cluster.executor, cwd=tmp_path, cache=tmp_path / "cluster-store")
    assert on_cluster.returncode == local.returncode != 0
    errors = [[line for line in run.stderr.splitlines() if line.startswith(("error", "  hint"))] for run in (local, on_cluster)]
    assert errors[0] and errors[1] == errors[0]


def test_a_worker_killed_mid_stage_is_replaced_and_the_build_succeeds(project, cluster, gate, tmp_path):
    from edgebuild.store.local import Store

    recipe = project(GATED)
    local = edgebuild("run", recipe, "--json", cwd=tmp_path, cache=tmp_path / "local-store")  # gate not armed yet
    (gate / "armed").touch()
    store = tmp_path / "cluster-store"
    run = start_edgebuild("run", recipe, "--executor", cluster.executor, "--json", cwd=tmp_path, cache=store)
    try:
        [victim] = wait_for(lambda: gate_pids(gate), "the optimize stage to start on a worker")
        assert victim in cluster.worker_pids()
        import os
        import signal

        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: not is_alive(victim), "the worker to die")
        (gate / "open").touch()
        out, err = run.communicate(timeout=300)
    finally:
        run.kill()
    assert run.returncode == 0, err
    retried = [pid for pid in gate_pids(gate) if pid != victim]
    assert retried, "the stage was not run again"

    class Done:  # summary() reads a finished process
        returncode, stdout, stderr = run.returncode, out, err

    same_builds(summary(local), summary(Done))
    # every entry in the store is whole: the killed attempt left at most a temporary, no entry
    entries = Store(store).entries()
    assert {e.key for e in entries} >= {k for _, k in summary(Done)["tiny:default"]["keys"][1:]}
    assert Store(store).corrupt() == []


def test_ctrl_c_cancels_the_tasks_on_the_cluster(project, cluster, gate, tmp_path):
    recipe = project(GATED)
    (gate / "armed").touch()
    run = start_edgebuild("run", recipe, "--executor", cluster.executor, cwd=tmp_path, cache=tmp_path / "store")
    try:
        wait_for(lambda: gate_pids(gate), "the optimize stage to start on a worker")
        assert any(key.startswith("optimize-") for key in cluster.tasks_on_scheduler())
        interrupt(run)
        _, err = run.communicate(timeout=120)
    finally:
        run.kill()
    assert run.returncode == 130, err
    # the client's futures are cancelled: the scheduler forgets this run's tasks (the stage body
    # already running finishes on its worker once the gate opens; Dask cannot stop a thread)
    wait_for(lambda: not cluster.tasks_on_scheduler(), "the scheduler to drop the cancelled tasks", 60)


def test_an_unreachable_scheduler_is_a_clear_error(project, tmp_path):
    recipe = project()
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = edgebuild("run", recipe, "--executor", f"dask://127.0.0.1:{port}", cwd=tmp_path, cache=tmp_path / "store")
    assert done.returncode == 1, done.stderr
    assert f"cannot reach the Dask scheduler at tcp://127.0.0.1:{port}" in done.stderr
    assert "make cluster" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("spec", ["dask://", "dask://host", "tcp://127.0.0.1:8786", "threads"])
def test_a_malformed_executor_is_a_usage_error(project, tmp_path, spec):
    done = edgebuild("run", project(), "--executor", spec, cwd=tmp_path, cache=tmp_path / "store")
    assert done.returncode == 2, done.stderr
    assert "expected `local` or `dask://HOST:PORT`" in done.stderr


def test_cluster_workers_push_to_the_remote_and_another_machine_builds_nothing(project, cluster, tmp_path):
    """Workers write through the shared remote: a second machine (its own store, no cluster) pulls every
    entry the cluster built and runs no stage."""
    import json

    recipe = project(VARIANTS)
    shared = (tmp_path / "shared").as_uri()
    on_cluster = edgebuild("run", recipe, "--executor", cluster.executor, "--remote", shared, "--json",
                           cwd=tmp_path, cache=tmp_path / "cluster-store")
    built = summary(on_cluster)
    keys = {key for variant in built.values() for name, key in variant["keys"] if name != "resolve"}
    assert {p.parent.name for p in (tmp_path / "shared" / "objects").glob("*/*/meta.json")} == keys
    elsewhere = edgebuild("run", recipe, "--remote", shared, "--json", cwd=tmp_path, cache=tmp_path / "other-store")
    assert elsewhere.returncode == 0, elsewhere.stderr
    statuses = {s["status"] for v in json.loads(elsewhere.stdout)["variants"] for s in v["stages"] if s["name"] != "resolve"}
    assert "pulled" in statuses and statuses <= {"pulled", "cached"}  # a stage two variants share: pulled once
