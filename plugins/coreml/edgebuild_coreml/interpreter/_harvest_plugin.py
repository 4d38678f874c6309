"""pytest plugin used by ``harvest``: turns coremltools' op tests into checked vectors.

Loaded with ``-p`` before the op test modules are collected, it replaces
``run_compare_builder`` (which they import by name) with a capture that builds the program
exactly as the original does, runs it with the MIL interpreter instead of Core ML, and
appends one JSON record per call to ``$EDGEBUILD_HARVEST_DIR/records-<pid>.jsonl``.
"""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path

import numpy as np

from coremltools.converters.mil.mil import Function, Program
from coremltools.converters.mil.mil.ops.tests import testing_utils

from .harvest import RECORDS_ENV


def _record(entry: dict) -> None:
    path = os.path.join(os.environ[RECORDS_ENV], f"records-{os.getpid()}.jsonl")
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")


_current = {"test": "?"}


def _test_id(item_or_report) -> str:
    """``iOS15/test_x.py::Class::test[params]``: the test files live outside the rootdir."""
    path = getattr(item_or_report, "path", None) or getattr(item_or_report, "fspath", None)
    where = f"{Path(str(path)).parent.name}/{Path(str(path)).name}" if path else "?"
    return where + "::" + item_or_report.nodeid.split("::", 1)[-1]


def _current_test() -> str:
    return _current["test"]


def pytest_runtest_setup(item):
    _current["test"] = _test_id(item)


def _build(build, placeholders, opset):
    prog = Program()
    with Function(placeholders, opset_version=opset) as func:
        outs = build(**func.inputs)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        func.set_outputs(outs)
        prog.add_function("main", func)
    return prog, outs


def _op_types(prog) -> list[str]:
    types: set[str] = set()

    def walk(block):
        for op in block.operations:
            if op.op_type != "const":
                types.add(op.op_type)
            for inner in op.blocks:
                walk(inner)

    walk(prog.functions["main"])
    return sorted(types)


def _compare(got: dict, expected: list, names: list, atol: float, rtol: float):
    """(all close?, worst |got - expected| beyond tolerance) over the outputs."""
    ok, worst = True, 0.0
    for name, want in zip(names, expected):
        have = got[name]
        want = np.asarray(want)
        if np.asarray(have).shape != want.shape and np.asarray(have).size != want.size:
            return False, float("inf")
        have = np.asarray(have).reshape(want.shape)
        if want.dtype == bool or have.dtype == bool:
            close = np.array_equal(have.astype(bool), want.astype(bool))
            excess = 0.0 if close else 1.0
        else:
            have64, want64 = have.astype(np.float64), want.astype(np.float64)
            close = bool(np.allclose(have64, want64, atol=atol, rtol=rtol, equal_nan=True))
            with np.errstate(invalid="ignore"):
                diff = np.abs(have64 - want64) - (atol + rtol * np.abs(want64))
            excess = float(np.nanmax(diff, initial=0.0)) if not close else 0.0
        ok = ok and close
        worst = max(worst, excess)
    return ok, worst


def capture_compare_builder(
    build,
    input_placeholders,
    input_values=None,
    expected_output_types=None,
    expected_outputs=None,
    compute_unit=None,
    frontend_only=False,
    backend=None,
    atol=1e-04,
    rtol=1e-05,
    inputs=None,
    also_compare_shapes=True,
    converter=None,
    pass_pipeline=None,
    pred_iters=None,
):
    from .executor import run_program

    precision = getattr(backend, "precision", "fp32")
    opset = getattr(backend, "opset_version", None)
    entry = {"test": _current_test(), "opset": getattr(opset, "name", str(opset)),
             "precision": precision}
    try:
        prog, outs = _build(build, input_placeholders, opset)
    except Exception as exc:  # the test may expect a build failure; not a vector
        entry.update(status="build_error", error=f"{type(exc).__name__}: {exc}"[:300])
        _record(entry)
        raise
    entry["ops"] = _op_types(prog)
    if frontend_only or expected_outputs is None or pred_iters is not None or inputs is not None:
        entry["status"] = "no_vector"
        _record(entry)
        return None
    expected = expected_outputs if isinstance(expected_outputs, list) else [expected_outputs]
    names = [v.name for v in outs]
    values = {k: np.asarray(v) for k, v in (input_values or {}).items()}
    try:
        # As Core ML's own check: fp16 precision widens the tolerances (compare_backend).
        loose_atol, loose_rtol = atol, rtol
        if precision == "fp16":
            loose_atol, loose_rtol = max(atol * 100.0, 5e-1), max(rtol * 100.0, 5e-2)
        got16 = run_program(prog, values, fp16=precision == "fp16")
        matched, excess = _compare(got16, expected, names, loose_atol, loose_rtol)
        got32 = got16 if precision != "fp16" else run_program(prog, values)
        strict, _ = _compare(got32, expected, names, atol, rtol)
        entry.update(status="matched" if matched else "mismatched", strict=strict, excess=excess)
    except Exception as exc:
        entry.update(
            status="eval_error",
            error=f"{type(exc).__name__}: {exc}"[:300],
            where=traceback.extract_tb(exc.__traceback__)[-1].name,
        )
    _record(entry)
    return None


testing_utils.run_compare_builder = capture_compare_builder


def pytest_runtest_logreport(report):
    """Record each test's outcome, to count tests that yielded no vector (and why)."""
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        outcome = "xfailed" if hasattr(report, "wasxfail") else report.outcome
        text = str(report.longrepr) if report.failed else ""
        if "name 'torch' is not defined" in text or "No module named 'torch'" in text:
            outcome = "failed_needs_torch"  # references computed with PyTorch, not installed
        elif report.failed:
            outcome = "failed_other"
        _outcome(_current_test(), outcome)


def pytest_collectreport(report):
    if report.failed:
        _outcome(str(report.nodeid) or "?", "collection_error")


def _outcome(test: str, outcome: str) -> None:
    path = os.path.join(os.environ[RECORDS_ENV], f"outcomes-{os.getpid()}.jsonl")
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"test": test, "outcome": outcome}) + "\n")
