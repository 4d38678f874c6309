"""Backend conformance against the ONNX backend node tests.

The cases come from the installed ``onnx`` wheel's own generators
(``onnx.backend.test.case.node.collect_testcases``): one small model per case, with inputs,
expected outputs and tolerances. Each case ends as one of

- ``pass`` / ``fail``: the backend ran it; outputs matched (or not) at the case's tolerances;
- ``error``: the backend has lowerings for every op but raised while lowering or running;
- ``unsupported``: a type the backend cannot carry (strings, bfloat16, sequences, ...) or an
  op with no lowering. Unsupported cases stay in the denominator of the pass rate.

A backend takes part by giving its backend object (the one registered under
``edgebuild_register_backends``) a method ``run_onnx_case(model_proto, inputs) -> outputs``.
Cases run in worker processes with a per-case timeout, so one hang cannot stall the suite.

    python -m edgebuild.conformance.suite --suite onnx-node --backend coreml --out docs/conformance.md
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import re
import sys
import time
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from edgebuild.errors import EdgebuildError, NotRepresentable, UsageError

SUITES = ("onnx-node",)
CASE_TIMEOUT_S = 60.0
STATUSES = ("pass", "fail", "error", "unsupported")

# Tensor element types a Core ML-class backend can hold (narrow integers and float64 travel
# as int32 / float32). Everything else is classified unsupported before the backend runs.
REPRESENTABLE_TYPES = {"FLOAT", "FLOAT16", "DOUBLE", "INT8", "UINT8", "INT16", "INT32", "INT64", "BOOL"}
# Ops that are data, not compute: every backend receives them as constants.
STRUCTURAL_OPS = {("", "Constant")}
_INT32 = np.iinfo(np.int32)


@dataclass
class Case:
    """One ONNX node test case, in a form that pickles cheaply to a worker."""

    name: str
    op: str  # the op under test ("domain::Op" outside the default domain)
    model: bytes  # serialized ModelProto
    inputs: list[np.ndarray]
    outputs: list[np.ndarray]
    rtol: float
    atol: float
    reason: str | None = None  # set when classified unsupported without running
    record: dict = field(default_factory=dict)


# -- collecting ----------------------------------------------------------------------------
def _qualified(domain: str, op_type: str) -> str:
    return op_type if domain in ("", "ai.onnx") else f"{domain}::{op_type}"


def _base_name(name: str) -> str:
    """``test_x_expanded_ver18`` -> ``test_x``: function-expanded cases test the same op."""
    return re.sub(r"_expanded(_ver\d+)?$", "", name)


def _array(value) -> np.ndarray:
    import onnx

    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    return value if isinstance(value, (list, dict)) else np.asarray(value)


def collect_cases(suite: str = "onnx-node", ops: Sequence[str] | None = None) -> list[Case]:
    """Every case of ``suite`` (optionally only the cases of ``ops``), sorted by name."""
    if suite not in SUITES:
        raise UsageError(f"unknown conformance suite {suite!r}", hint=f"choose one of: {', '.join(SUITES)}")
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # the generators' own overflow/divide warnings
        testcases = list(collect_testcases())
    op_of = {
        t.name: _qualified(t.model.graph.node[0].domain, t.model.graph.node[0].op_type)
        for t in testcases
        if len(t.model.graph.node) == 1
    }
    wanted = _op_filter(ops, set(op_of.values()))
    cases = []
    for t in testcases:
        op = op_of.get(t.name) or op_of.get(_base_name(t.name)) or "?"
        if wanted is not None and op not in wanted:
            continue
        inputs, outputs = t.data_sets[0]
        cases.append(Case(t.name, op, t.model.SerializeToString(), [_array(a) for a in inputs],
                          [_array(a) for a in outputs], t.rtol, t.atol))
    return sorted(cases, key=lambda c: c.name)


def _op_filter(ops: Sequence[str] | None, known: set[str]) -> set[str] | None:
    if not ops:
        return None
    by_lower = {op.lower(): op for op in known}
    unknown = [op for op in ops if op.lower() not in by_lower]
    if unknown:
        raise UsageError(
            f"no ONNX node test cases for op(s): {', '.join(unknown)}",
            hint="op names are ONNX op types as spelled in the spec, e.g. Add,Conv,ReduceMean",
        )
    return {by_lower[op.lower()] for op in ops}


# -- classifying -----------------------------------------------------------------------------
def _type_problem(type_proto) -> str | None:
    """Why a value of this ONNX type cannot reach the backend, or None."""
    import onnx

    kind = type_proto.WhichOneof("value")
    if kind in ("sequence_type", "optional_type", "map_type"):
        return f"{kind.removesuffix('_type')} values"
    if kind == "sparse_tensor_type":
        return "sparse tensors"
    if kind == "tensor_type":
        name = onnx.TensorProto.DataType.Name(type_proto.tensor_type.elem_type)
        if name not in REPRESENTABLE_TYPES:
            return f"{name.lower()} tensors"
    return None


def _graph_type_problem(graph) -> str | None:
    for value in list(graph.input) + list(graph.output):
        problem = _type_problem(value.type)
        if problem:
            return problem
    for node in graph.node:
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                problem = _graph_type_problem(sub)
                if problem:
                    return problem
    return None


def _value_problem(arrays: Sequence) -> str | None:
    for array in arrays:
        if not isinstance(array, np.ndarray):
            return "sequence values"
        if array.dtype == object:
            return "string tensors"
        if array.size == 0:
            return "empty (zero-size) tensors"
        if array.dtype.kind in "iu" and array.size and (array.min() < _INT32.min or array.max() > _INT32.max):
            return "integers beyond int32 range"
    return None


def _iter_nodes(graph):
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                yield from _iter_nodes(sub)


def missing_lowerings(model, registry, backend: str) -> list[str]:
    """Ops of ``model`` (including subgraphs) the backend has no lowering for at its opset."""
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    missing = []
    for node in _iter_nodes(model.graph):
        domain = "" if node.domain == "ai.onnx" else node.domain
        if (domain, node.op_type) in STRUCTURAL_OPS:
            continue
        if registry.lowering(backend, node.op_type, domain, opsets.get(domain, 1)) is None:
            op = _qualified(domain, node.op_type)
            if op not in missing:
                missing.append(op)
    return missing


def classify(case: Case, registry, backend: str) -> str | None:
    """The reason ``case`` cannot run on ``backend`` (types, missing lowerings), or None."""
    import onnx

    model = onnx.load_from_string(case.model)
    problem = _graph_type_problem(model.graph) or _value_problem(case.inputs) or _value_problem(case.outputs)
    if problem:
        return problem
    missing = missing_lowerings(model, registry, backend)
    if missing:
        return "no lowering: " + ", ".join(missing)
    return None


# -- comparing ------------------------------------------------------------------------------
def compare(actual: Sequence[np.ndarray], expected: Sequence[np.ndarray], rtol: float, atol: float) -> dict:
    """``{"status": "pass"|"fail", "reason"?, "max_abs_err"?}`` as onnx's backend runner judges:
    same count and shapes, integers and booleans equal, floats within ``atol + rtol*|ref|``.
    Integer widths may differ (int32 results for int64 references); NaNs compare equal."""
    if len(actual) != len(expected):
        return {"status": "fail", "reason": f"produced {len(actual)} outputs, expected {len(expected)}"}
    worst = 0.0
    for i, (got, ref) in enumerate(zip(actual, expected)):
        got, ref = np.asarray(got), np.asarray(ref)
        if got.shape != ref.shape:
            return {"status": "fail", "reason": f"output {i}: shape {got.shape} != expected {ref.shape}"}
        if got.dtype.kind not in "biuf":
            return {"status": "fail", "reason": f"output {i}: dtype {got.dtype} where {ref.dtype} is expected"}
        if ref.dtype.kind in "biu":
            if got.dtype.kind == "f":
                return {"status": "fail", "reason": f"output {i}: dtype {got.dtype} where {ref.dtype} is expected"}
            diff = np.abs(got.astype(np.int64) - ref.astype(np.int64))
            err = float(diff.max()) if diff.size else 0.0
            worst = max(worst, err)
            if err:
                return {"status": "fail", "reason": f"output {i}: {int(np.count_nonzero(diff))} of {diff.size} "
                        "values differ", "max_abs_err": worst}
            continue
        got64, ref64 = got.astype(np.float64), ref.astype(np.float64)
        with np.errstate(all="ignore"):
            close = np.isclose(got64, ref64, rtol=rtol, atol=atol, equal_nan=True)
            finite = np.isfinite(got64) & np.isfinite(ref64)
            diff = np.abs(got64 - ref64)[finite]
        if diff.size:
            worst = max(worst, float(diff.max()))
        if not close.all():
            return {"status": "fail", "reason": f"output {i}: {int((~close).sum())} of {close.size} values "
                    f"outside rtol={rtol:g}, atol={atol:g}", "max_abs_err": worst}
    return {"status": "pass", "max_abs_err": worst}


# -- running --------------------------------------------------------------------------------
def resolve_runner(backend: str, runner: str | None = None) -> Callable:
    """The callable running one case: ``runner`` ("module:function") if given, else the
    registered backend's ``run_onnx_case``."""
    if runner:
        module, _, name = runner.partition(":")
        return getattr(importlib.import_module(module), name)
    from edgebuild.registry import get_registry

    registered = get_registry().get("backends", backend)
    if registered is None:
        raise UsageError(f"no backend {backend!r} is installed", hint="see `edgebuild plugins` for what is")
    run = getattr(registered, "run_onnx_case", None)
    if run is None:
        raise UsageError(
            f"backend {backend!r} does not run ONNX conformance cases",
            hint="the backend object needs a method run_onnx_case(model_proto, inputs) -> list of arrays",
        )
    return run


def runner_notes(backend: str, runner: str | None = None) -> str | None:
    """The ``CONFORMANCE_NOTES`` string of the module defining the backend's case runner."""
    try:
        run = resolve_runner(backend, runner)
    except EdgebuildError:
        return None
    return getattr(sys.modules.get(getattr(run, "__module__", ""), None), "CONFORMANCE_NOTES", None)


def run_case(run: Callable, case: Case) -> dict:
    """Run one case with ``run`` and judge it: the case's record without name and op."""
    import onnx

    model = onnx.load_from_string(case.model)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            actual = run(model, list(case.inputs))
    except NotRepresentable as exc:  # a semantic the format lacks, like a type it lacks
        return {"status": "unsupported", "reason": _one_line(exc.message)}
    except EdgebuildError as exc:
        return {"status": "error", "reason": _one_line(exc.message)}
    except Exception as exc:  # noqa: BLE001 - a backend bug is a result to report, not a crash
        return {"status": "error", "reason": _one_line(f"{type(exc).__name__}: {exc}")}
    return compare(actual, case.outputs, case.rtol, case.atol)


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _warm_up(run: Callable) -> None:
    """Run a one-node model once, so the backend's imports (seconds on a busy
    machine) are not charged to the first real case's timeout."""
    import onnx.helper as oh

    value = oh.make_tensor_value_info
    graph = oh.make_graph([oh.make_node("Relu", ["x"], ["y"])], "warm_up",
                          [value("x", 1, [1])], [value("y", 1, [1])])
    try:
        run(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 14)]), [np.zeros(1, np.float32)])
    except Exception:  # noqa: BLE001 - a real case will report the problem
        pass


def _worker(conn, backend: str, runner: str | None) -> None:
    """Worker process: receive cases, send back records, until told to stop (None)."""
    try:
        run = resolve_runner(backend, runner)
    except Exception as exc:  # noqa: BLE001
        conn.send({"status": "error", "reason": _one_line(f"backend setup failed: {exc}")})
        return
    _warm_up(run)
    try:
        conn.send("ready")
        while True:
            case = conn.recv()
            if case is None:
                return
            try:
                record = run_case(run, case)
            except Exception:  # noqa: BLE001
                record = {"status": "error", "reason": _one_line(traceback.format_exc().splitlines()[-1])}
            conn.send(record)
    except (EOFError, OSError, KeyboardInterrupt):  # the parent went away: stop quietly
        return


class _WorkerPool:
    """``jobs`` worker processes, each running one case at a time under a timeout; a worker
    that hangs or dies is replaced and its case is recorded as an error."""

    def __init__(self, jobs: int, backend: str, runner: str | None, timeout: float):
        self._context = multiprocessing.get_context("spawn")  # no fork of a threaded parent
        self._args, self._timeout = (backend, runner), timeout
        self._idle: list = []
        self._busy: dict = {}  # conn -> (case, started)
        self._procs: dict = {}
        self._starting: set = set()  # conns of workers not yet ready
        for _ in range(jobs):
            self._start()

    def _start(self) -> None:
        parent, child = self._context.Pipe()
        process = self._context.Process(target=_worker, args=(child, *self._args), daemon=True)
        process.start()
        child.close()
        self._procs[parent] = process
        self._starting.add(parent)

    def _retire(self, conn) -> None:
        process = self._procs.pop(conn)
        process.kill()
        process.join()
        conn.close()

    def run(self, cases: list[Case], done: Callable[[Case, dict], None]) -> None:
        queue = list(reversed(cases))
        while queue or self._busy:
            while queue and self._idle:
                conn = self._idle.pop()
                case = queue.pop()
                conn.send(case)
                self._busy[conn] = (case, time.monotonic())
            ready = wait(list(self._busy) + list(self._starting), timeout=1.0)
            for conn in ready:
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    message = None
                if conn in self._starting:
                    self._starting.discard(conn)
                    if message == "ready":
                        self._idle.append(conn)
                        continue
                    self._retire(conn)
                    raise EdgebuildError(f"conformance worker failed to start: {message}")
                case, _ = self._busy.pop(conn)
                if message is None:
                    self._retire(conn)
                    self._start()
                    message = {"status": "error", "reason": "the worker process died while running this case"}
                else:
                    self._idle.append(conn)
                done(case, message)
            now = time.monotonic()
            for conn, (case, started) in list(self._busy.items()):
                if now - started > self._timeout:
                    del self._busy[conn]
                    self._retire(conn)
                    self._start()
                    done(case, {"status": "error", "reason": f"timed out after {self._timeout:g} s"})

    def close(self) -> None:
        for conn in list(self._procs):
            try:
                conn.send(None)
            except OSError:
                pass
            process = self._procs.pop(conn)
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()


def run_suite(
    suite: str = "onnx-node",
    backend: str = "coreml",
    ops: list[str] | None = None,
    jobs: int = 1,
    progress: Callable[[int, int, dict], None] | None = None,
    *,
    runner: str | None = None,
    timeout: float = CASE_TIMEOUT_S,
) -> dict:
    """Run ``suite`` on ``backend``; returns ``{"cases", "passed", "total", "by_op"}``.

    ``cases`` holds one ``{"name", "op", "status", "reason"?, "max_abs_err"?}`` per case,
    ``by_op`` maps each op to its status counts and whether the backend lowers it.
    ``progress(done, total, case_record)`` is called as cases finish. ``runner`` names a
    ``module:function`` to use instead of the registered backend's ``run_onnx_case``.
    """
    from edgebuild.registry import get_registry

    registry = get_registry()
    if runner is None:
        resolve_runner(backend)  # fail early, in this process, when the backend cannot run cases
    cases = collect_cases(suite, ops)
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
        reason = classify(case, registry, backend)
        if reason:
            done(case, {"status": "unsupported", "reason": reason})
        else:
            runnable.append(case)
    if runnable:
        pool = _WorkerPool(max(1, min(jobs, len(runnable))), backend, runner, timeout)
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


def summarise_by_op(records: list[dict], registry, backend: str) -> dict[str, dict]:
    """op -> {"passed", "failed", "error", "unsupported", "total", "supported"}; an op is
    supported when the backend has a lowering for it (some case of it got past the scan
    for lowerings)."""
    summary: dict[str, dict] = {}
    for record in records:
        row = summary.setdefault(record["op"], {"passed": 0, "failed": 0, "error": 0, "unsupported": 0, "total": 0,
                                                "supported": False})
        key = {"pass": "passed", "fail": "failed"}.get(record["status"], record["status"])
        row[key] += 1
        row["total"] += 1
    for op, row in summary.items():
        domain, _, op_type = op.rpartition("::")
        row["supported"] = any(
            registry.lowering(backend, op_type, domain, opset) is not None for opset in range(1, 30)
        )
    return dict(sorted(summary.items()))


# -- reporting ------------------------------------------------------------------------------
def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def unsupported_reasons(result: dict) -> Counter:
    """Reason -> number of unsupported cases ("no lowering: X" folded into one reason)."""
    return Counter(
        "no lowering" if r["reason"].startswith("no lowering") else r["reason"]
        for r in result["cases"] if r["status"] == "unsupported"
    )


def _weak_ops(supported: dict[str, dict], threshold: float = 0.95) -> list[str]:
    weak = []
    for op, row in supported.items():
        attempted = row["total"] - row["unsupported"]
        if attempted and row["passed"] < threshold * attempted:
            weak.append(f"{op} ({row['passed']}/{attempted})")
    return weak


def write_table(result: dict, path: str | Path, *, suite: str = "onnx-node", backend: str = "coreml",
                notes: str | None = None) -> None:
    """Write ``result`` as Markdown: the summary line, a per-op table, the unsupported reasons
    and the failing/erroring cases. ``notes`` says how the backend runs cases (see
    :func:`runner_notes`)."""
    passed, total = result["passed"], result["total"]
    by_op = result["by_op"]
    supported = {op: row for op, row in by_op.items() if row["supported"]}
    attempted = sum(row["total"] - row["unsupported"] for row in supported.values())
    passed_supported = sum(row["passed"] for row in supported.values())
    lines = [
        f"# Conformance: {suite} on {backend}",
        "",
        "Generated by `python -m edgebuild.conformance.suite --suite onnx-node --backend coreml "
        "--out docs/conformance.md` from the ONNX backend node test cases of the installed `onnx` "
        "wheel. A case passes when every output matches at the case's tolerances "
        "(onnx's default rtol=1e-3, atol=1e-7; integers exactly). `fail`: wrong numbers; "
        "`error`: the backend refused or broke while lowering/running (reason below); "
        "`unsupported`: a type or shape the backend cannot hold, or an op with no lowering. "
        "Unsupported cases count in the denominator.",
        "",
        f"How `{backend}` runs the cases: {notes}" if notes else "",
        "",
        f"**{passed} / {total} cases pass ({_pct(passed, total)}).** "
        f"{len(supported)} of {len(by_op)} ops have a lowering; their cases that reach the backend "
        f"pass {passed_supported} / {attempted} ({_pct(passed_supported, attempted)}).",
        "",
        f"Ops with a lowering that pass under 95% of the cases reaching the backend: "
        f"{', '.join(_weak_ops(supported)) or 'none'}.",
        "",
        "| op | passed | failed | error | unsupported | total | pass % |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for op, row in by_op.items():
        name = op if row["supported"] else f"{op} (no lowering)"
        lines.append(f"| {name} | {row['passed']} | {row['failed']} | {row['error']} | {row['unsupported']} "
                     f"| {row['total']} | {_pct(row['passed'], row['total'])} |")
    lines += ["", "## Why cases are unsupported", "", "| reason | cases |", "|---|---:|"]
    for reason, count in unsupported_reasons(result).most_common():
        lines.append(f"| {reason} | {count} |")
    problems = [r for r in result["cases"] if r["status"] in ("fail", "error")]
    if problems:
        lines += ["", "## Failing and erroring cases", "", "| case | op | status | reason |", "|---|---|---|---|"]
        for r in problems:
            reason = r.get("reason", "").replace("|", "\\|")
            lines.append(f"| {r['name']} | {r['op']} | {r['status']} | {reason} |")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _summary_table(result: dict):
    from rich.table import Table

    table = Table(title=f"{result['passed']} / {result['total']} cases pass ({_pct(result['passed'], result['total'])})")
    for column in ("op", "passed", "failed", "error", "unsupported", "total", "pass %"):
        table.add_column(column, justify="left" if column == "op" else "right")
    for op, row in result["by_op"].items():
        table.add_row(op if row["supported"] else f"{op} (no lowering)", str(row["passed"]), str(row["failed"]),
                      str(row["error"]), str(row["unsupported"]), str(row["total"]), _pct(row["passed"], row["total"]))
    return table


def cli_main(
    suite: str = "onnx-node",
    backend: str = "coreml",
    ops: list[str] | str | None = None,
    as_json: bool = False,
    jobs: int = 2,
    *,
    out: str | Path | None = None,
    runner: str | None = None,
) -> int:
    """What ``edgebuild conformance`` does: progress on stderr; JSON on stdout with
    ``as_json``, else a per-op summary table; the Markdown table to ``out`` if given.
    Returns the exit code (0 once the suite ran, whatever its pass rate)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    stderr = Console(stderr=True, highlight=False)
    if isinstance(ops, str):
        ops = [op.strip() for op in ops.split(",") if op.strip()]
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=stderr, transient=True) as bar:
            task = bar.add_task(f"{suite} on {backend}", total=None)

            def progress(finished: int, total: int, record: dict) -> None:
                bar.update(task, completed=finished, total=total, description=f"{suite} on {backend}: {record['op']}")

            result = run_suite(suite, backend, ops, jobs, progress, runner=runner)
    except EdgebuildError as exc:
        stderr.print(f"[red]error:[/red] {exc}")
        return exc.exit_code
    if out:
        write_table(result, out, suite=suite, backend=backend, notes=runner_notes(backend, runner))
        stderr.print(f"wrote {out}")
    if as_json:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        Console(highlight=False).print(_summary_table(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgebuild.conformance.suite", description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="onnx-node", choices=SUITES)
    parser.add_argument("--backend", default="coreml")
    parser.add_argument("--ops", default=None, help="comma-separated op types (default: all)")
    parser.add_argument("--json", dest="as_json", action="store_true", help="the result as JSON on stdout")
    parser.add_argument("-j", "--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--out", default=None, help="write the Markdown table here (e.g. docs/conformance.md)")
    parser.add_argument("--runner", default=None, help="module:function to run cases instead of the backend's")
    args = parser.parse_args(argv)
    return cli_main(args.suite, args.backend, args.ops, args.as_json, args.jobs, out=args.out, runner=args.runner)


if __name__ == "__main__":
    raise SystemExit(main())
