"""Build progress on stderr: what runs, how far it got (:mod:`edgebuild.progress`), what it cost.

Three displays, chosen by the CLI:

- a terminal: a live status of every running stage (sub-step, done of total, elapsed time)
  above which a line per finished stage scrolls (rich, imported only then);
- anything else (CI logs, pipes): plain lines, one when a stage starts building and one
  when it ends;
- ``-q``: errors only.

The plain printer avoids rich (40 ms of imports on a no-op build) and understands the few
rich-style tags it needs ([bold], [dim], [red], [green], [cyan], [yellow], closed by [/]).
"""

from __future__ import annotations

import os
import re
import sys
import threading

from edgebuild.progress import STARTED
from edgebuild.report.verdict import FAILED, NOT_VALIDATED, PASSED

_CODES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "cyan": "36", "yellow": "33"}
_TAG = re.compile(r"(?<!\\)\[(/|bold|dim|red|green|cyan|yellow)\]")
_TAG_LIKE = re.compile(r"(\\*)(\[[a-z#/@][^[]*?])")  # what rich would read as a tag


def escape(text) -> str:
    """``text`` (a path, a message) safe inside a line with tags, as rich.markup.escape does it."""
    return _TAG_LIKE.sub(lambda m: f"{m.group(1)}{m.group(1)}\\{m.group(2)}", str(text))


def stage_line(label: str, stage: str, status: str, seconds: float) -> str:
    colour = "green" if status == "ran" else "cyan"
    return f"[dim]{label}[/] {stage:<9} [{colour}]{status:<6}[/] {seconds:7.2f}s"


#: a stage result new to this machine (built here, or taken from the remote cache): its warnings
#: are news. A result from the local store was built here before, and its warnings were printed
#: then; they stay in the report (its Warnings section) and are counted on the result line.
FRESH = ("ran", "pulled")


def warning_lines(result) -> list[str]:
    """A stage's ``info["warnings"]`` (e.g. a compute plan with nothing on the Neural Engine)."""
    return [f"[yellow]warning[/] {escape(text)}" for text in (result.info or {}).get("warnings", [])]


def is_fresh(result) -> bool:
    return getattr(result, "status", None) in FRESH


def unprinted_warnings(results, *, replay: bool = False) -> int:
    """How many warnings of ``results`` their stage lines did not print: the cached stages', or
    every stage's on the replay of an up-to-date run."""
    return sum(len((r.info or {}).get("warnings") or []) for r in results if replay or not is_fresh(r))


def result_line(label: str, *, failures: int, validated: bool, where: str, size: str, report: str,
                warnings: int = 0) -> str:
    """A variant's last word: its verdict (report.verdict's words), artifact and size, its report,
    and how many warnings only the report shows now."""
    if failures:
        verdict = f"[red]{FAILED}[/] ({failures} limit{'s' if failures > 1 else ''})"
    else:
        verdict = f"[green]{PASSED}[/]" if validated else f"[yellow]{NOT_VALIDATED}[/]"
    held = f"  [yellow]{warnings} warning{'s' if warnings > 1 else ''}[/], see the report" if warnings else ""
    return f"[bold]{label}[/] {verdict}  {where} ({size})  report: {report}{held}"


def renaming_lines(label: str, result) -> list[str]:
    """A stage's ``info["renamings"]``: each tensor the artifact names differently from the source model."""
    lines = []
    for row in (result.info or {}).get("renamings") or []:
        where = f" (segment {row['segment']})" if row.get("segment") is not None else ""
        why = f": {row['reason']}" if row.get("reason") else ""
        lines.append(f"[dim]{label}[/] renamed {row['tensor']}{where} {escape(repr(row['onnx']))} -> "
                     f"{escape(row['artifact'])}{escape(why)}")
    return lines


def generation_lines(result) -> list[str]:
    """The validate stage of a generative recipe: per runtime, how far the artifact's greedy tokens
    followed the source's."""
    lines = []
    for runtime, record in ((result.info or {}).get("runtimes") or {}).items():
        generation = record.get("generation") if isinstance(record, dict) else None
        if isinstance(generation, dict):
            lines.append(f"[dim]generation ({escape(runtime)}):[/] {escape(generation_summary(generation))}")
    return lines


def generation_summary(generation: dict) -> str:
    """``2 prompts x 16 tokens, token agreement 100.0%, worst step 1 − cosine 2.1e-06, no divergence``
    (1 − cosine: the distance from identical logits a limit like 0.9999 is about)."""
    prompts = generation.get("prompts") or []
    agreement, cosine = generation.get("mean_agreement"), generation.get("worst_step_cosine")
    divergence = generation.get("first_divergence")
    return ", ".join([
        f"{len(prompts)} prompt{'' if len(prompts) == 1 else 's'} x {generation.get('new_tokens')} tokens",
        f"token agreement {agreement:.1%}" if isinstance(agreement, float) else f"token agreement {agreement}",
        f"worst step 1 − cosine {1.0 - cosine:.2g}" if isinstance(cosine, float) else f"worst step cosine {cosine}",
        "no divergence" if divergence is None else f"first divergence at step {divergence}",
    ])


def detail_lines(result, *, fresh: bool | None = None) -> list[str]:
    """What to say under a finished stage: its warnings (only when ``fresh``, by default when the
    stage ran: see ``FRESH``), what the optimise stage did with a quantised source (weight-only
    or not), and how generation validation went."""
    shown = is_fresh(result) if fresh is None else fresh
    lines = (warning_lines(result) if shown else []) + generation_lines(result)
    record = (result.info or {}).get("quantization")
    if isinstance(record, dict):
        from edgebuild.report.schema import Quantization

        quantization = Quantization.model_validate(record)
        if quantization.applies:
            lines.append(f"[dim]quantised source:[/] {escape(quantization.summary)}")
    return lines


def compression_summary(report_json) -> str | None:
    """What compression did, from a variant's ``report.json``: ``int8 linear weights, per-channel;
    weights 3.96× smaller than the source (fp32)``. The ratio is against the source model's
    weights (an fp16 build halves fp32 weights before any compression); None without a
    compression record."""
    import json

    from edgebuild.report.schema import Report

    try:
        report = Report.model_validate(json.loads(open(report_json, encoding="utf-8").read()))
    except (OSError, ValueError):
        return None
    compression = report.compression
    if compression is None or not compression.weights:
        return None
    words = compression.applied or "compressed"
    _, dtype = report.source_weights
    if report.ratio_to_source is not None:
        source = f"the source ({dtype})" if dtype else "the source"
        return f"{words}; weights {report.ratio_to_source:.2f}× smaller than {source}"
    return f"{words}; weights {compression.ratio:.2f}× smaller than uncompressed" if compression.ratio else words


class Printer:
    """Plain lines (colour on a terminal unless NO_COLOR); ``quiet``: errors only."""

    def __init__(self, stream=None, *, quiet: bool = False, verbose: bool = False):
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.verbose = verbose
        self.colour = _is_terminal(self.stream) and not os.environ.get("NO_COLOR")
        self._lock = threading.Lock()

    def _render(self, match: re.Match) -> str:
        if not self.colour:
            return ""
        tag = match.group(1)
        return "\033[0m" if tag == "/" else f"\033[{_CODES[tag]}m"

    def _write(self, text: str) -> None:
        with self._lock:
            self.stream.write(_TAG.sub(self._render, str(text)).replace("\\[", "[") + "\n")
            self.stream.flush()

    def print(self, text: str) -> None:
        """A line of normal output (none with ``quiet``)."""
        if not self.quiet:
            self._write(text)

    def error(self, text: str) -> None:
        """A line that is shown even with ``quiet``."""
        self._write(text)

    def on_event(self, label: str, event: str, payload) -> None:
        """The executor's events: ``<stage>:start``, ``<stage>:progress`` (a Step), ``<stage>:done`` (a Result)."""
        stage, _, what = event.partition(":")
        if what == "progress" and payload.step == STARTED:
            self.print(f"[dim]{label}[/] {stage:<9} started")
        elif what == "done":
            self.print(stage_line(label, stage, payload.status, payload.seconds))
            for line in detail_lines(payload) + renaming_lines(label, payload):
                self.print(line)

    def close(self) -> None:
        """Stop any live display (the plain printer has none)."""


class LivePrinter(Printer):
    """A terminal: a live status line per running stage, finished stages scrolling above it."""

    def __init__(self, stream=None, *, verbose: bool = False, console=None):
        super().__init__(stream, verbose=verbose)
        from rich.console import Console

        self.console = console or Console(file=self.stream, highlight=False)
        self._live = None  # rich.progress.Progress, started with the first stage
        self.tasks: dict[tuple[str, str], int] = {}  # (variant label, stage) -> task id

    def _progress(self):
        if self._live is None:
            from rich.progress import (
                BarColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            self._live = Progress(
                SpinnerColumn(), TextColumn("[dim]{task.fields[label]}[/] {task.fields[stage]:<9}"),
                BarColumn(bar_width=24), TextColumn("{task.fields[count]:>9} {task.fields[step]}"),
                TimeElapsedColumn(), console=self.console, transient=True, refresh_per_second=8,
            )
            self._live.start()
        return self._live

    def print(self, text: str) -> None:
        # soft_wrap: a long path wraps where the terminal wraps it, not at a newline rich inserts
        (self._live.console if self._live is not None else self.console).print(text, soft_wrap=True, highlight=False)

    def error(self, text: str) -> None:
        self.print(text)

    def on_event(self, label: str, event: str, payload) -> None:
        stage, _, what = event.partition(":")
        key = (label, stage)
        with self._lock:
            if what == "start":
                self.tasks[key] = self._progress().add_task(stage, total=None, label=label, stage=stage,
                                                            step="", count="")
            elif what == "progress" and key in self.tasks and payload.step != STARTED:
                count = f"{payload.done}/{payload.total}" if payload.total else str(payload.done)
                self._live.update(self.tasks[key], completed=payload.done, total=payload.total,
                                  step=payload.step, count=count)
            elif what == "done":
                task = self.tasks.pop(key, None)
                if task is not None:
                    self._live.remove_task(task)
                    self._live.refresh()  # else the line below is drawn with the finished stage still live
                self.print(stage_line(label, stage, payload.status, payload.seconds))
                for line in detail_lines(payload) + renaming_lines(label, payload):
                    self.print(line)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


class RichPrinter(Printer):
    """Plain lines through a rich console a caller already has (tests, programs embedding edgebuild)."""

    def __init__(self, console, *, verbose: bool = False):
        super().__init__(console.file, quiet=console.quiet, verbose=verbose)
        self.console = console

    def _write(self, text: str) -> None:
        with self._lock:
            self.console.print(text, soft_wrap=True, highlight=False)


def as_printer(console, *, verbose: bool = False) -> Printer:
    """``console`` as a display: a Printer stays one, a rich console is wrapped."""
    return console if isinstance(console, Printer) else RichPrinter(console, verbose=verbose)


def printer_for(stream=None, *, quiet: bool = False, verbose: bool = False) -> Printer:
    """The display ``edgebuild run`` uses: live on a terminal, plain lines elsewhere, errors only if ``quiet``."""
    stream = stream or sys.stderr
    if not quiet and _is_terminal(stream) and os.environ.get("TERM") != "dumb":
        return LivePrinter(stream, verbose=verbose)
    return Printer(stream, quiet=quiet, verbose=verbose)


def _is_terminal(stream) -> bool:
    return hasattr(stream, "isatty") and stream.isatty()
