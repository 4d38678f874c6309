"""Running a whole suite on a backend: collect, set aside what cannot run, run the rest in workers."""

from __future__ import annotations

from typing import Callable

from edgebuild.conformance.cases import Case, collect_cases
from edgebuild.conformance.classify import classify
from edgebuild.conformance.pool import WorkerPool
from edgebuild.conformance.runner import resolve_runner
from edgebuild.conformance.tables import summarise_by_op

CASE_TIMEOUT_S = 60.0


def run_suite(
    suite: str = "onnx-node",
    backend: str | None = None,
    ops: list[str] | None = None,
    jobs: int = 1,
    progress: Callable[[int, int, dict], None] | None = None,
    *,
    runner: str | None = None,
    timeout: float = CASE_TIMEOUT_S,
) -> dict:
    """Run ``suite`` on ``backend`` (default: the registry's default backend); returns
    ``{"cases", "passed", "total", "by_op"}``.

    ``cases`` holds one ``{"name", "op", "status", "reason"?, "max_abs_err"?}`` per case,
    ``by_op`` maps each op to its status counts and whether the backend lowers it.
    ``progress(done, total, case_record)`` is called as cases finish. ``runner`` names a
    ``module:function`` to use instead of the registered backend's conformance runner.
    """
    from edgebuild.registry import get_registry

    registry = get_registry()
    backend = backend or registry.default_backend()
    if runner is None:
        resolve_runner(backend)  # fail early, in this process, when the backend cannot run cases
    cases = collect_cases(suite, ops, registry)
    records: dict[str, dict] = {}
    finished = 0

    def done(case: Case, outcome: dict) -> None:
        nonlocal finished
        finished += 1
        records[case.name] = {"name": case.name, "op": case.op, **outcome}
        if progress:
            progress(finished, len(cases), records[case.name])

    runnable = []
    for case in cases:
        reason = case.reason or classify(case, registry, backend)
        if reason:
            done(case, {"status": "unsupported", "reason": reason})
        else:
            runnable.append(case)
    if runnable:
        pool = WorkerPool(max(1, min(jobs, len(runnable))), backend, runner, timeout)
        try:
            pool.run(runnable, done)
        finally:
            pool.close()
    ordered = [records[c.name] for c in cases]
    return {
        "cases": ordered,
        "passed": sum(r["status"] == "pass" for r in ordered),
        "total": len(ordered),
        "by_op": summarise_by_op(ordered, registry, backend),
    }
