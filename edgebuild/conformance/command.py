"""``edgebuild conformance``: the suite with a progress bar on stderr, its summary, JSON or Markdown.

The only module of the package that prints. It imports typer alone: the suite's modules (numpy,
onnx) load when the command runs, not when ``edgebuild --help`` lists it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer


def conformance(
    suite: str = typer.Option("onnx-node", "--suite", help="the cases: onnx-node (the onnx wheel's backend node tests), or a plugin's "
                                    "(stablehlo: jax.lax primitives, with edgebuild-jax)"),
    backend: Optional[str] = typer.Option(None, "--backend", help="the backend to test (default: the installed default backend)"),
    ops: Optional[str] = typer.Option(None, "--ops", help="comma-separated op types (default: all)"),
    jobs: int = typer.Option(2, "-j", "--jobs", min=1, help="worker processes"),
    as_json: bool = typer.Option(False, "--json", help="the result as JSON on stdout"),
    out: Optional[Path] = typer.Option(None, "--out", help="write the Markdown table here (docs/conformance.md)"),
    runner: Optional[str] = typer.Option(None, "--runner", help="module:function that runs each case instead of the backend's runner"),
):
    """Run the ONNX backend node tests through a backend and its reference executor."""
    from rich.console import Console

    from edgebuild.conformance.runner import resolve_runner
    from edgebuild.conformance.suite import run_suite
    from edgebuild.conformance.tables import write_table
    from edgebuild.registry import get_registry

    stderr = Console(stderr=True, highlight=False)
    backend = backend or get_registry().default_backend()
    wanted = [op.strip() for op in ops.split(",") if op.strip()] if ops else None
    result = _with_progress(stderr, f"{suite} on {backend}",
                            lambda progress: run_suite(suite, backend, wanted, jobs, progress, runner=runner))
    if out:
        # the runner's notes speak of the ONNX node cases
        notes = resolve_runner(backend, runner).notes if suite == "onnx-node" else None
        write_table(result, out, suite=suite, backend=backend, notes=notes)
        stderr.print(f"wrote {out}")
    if as_json:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        Console(highlight=False).print(_summary_table(result))


def _with_progress(console, title: str, run_suite):
    """``run_suite(progress)`` under a transient progress bar naming the op of the last finished case."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task(title, total=None)

        def progress(finished: int, total: int, record: dict) -> None:
            bar.update(task, completed=finished, total=total, description=f"{title}: {record['op']}")

        return run_suite(progress)


def _summary_table(result: dict):
    from rich.table import Table

    from edgebuild.conformance.tables import pct

    table = Table(title=f"{result['passed']} / {result['total']} cases pass ({pct(result['passed'], result['total'])})")
    for column in ("op", "passed", "failed", "error", "unsupported", "total", "pass %"):
        table.add_column(column, justify="left" if column == "op" else "right")
    for op, row in result["by_op"].items():
        table.add_row(op if row["supported"] else f"{op} (no lowering)", str(row["passed"]), str(row["failed"]),
                      str(row["error"]), str(row["unsupported"]), str(row["total"]), pct(row["passed"], row["total"]))
    return table
