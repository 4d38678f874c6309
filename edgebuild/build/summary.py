"""The table closing a run of several variants: per variant its status, artifact size, worst
metric, seconds and stages cached/ran. Read off the run's ``--json`` records, so it says
exactly what the JSON says; drawn with rich on a terminal, as aligned plain lines elsewhere."""

from __future__ import annotations

import math
from dataclasses import dataclass

from edgebuild.report.console import LivePrinter, escape
from edgebuild.report.html import COSINES, human_bytes
from edgebuild.report.verdict import FAILED, NOT_VALIDATED, PASSED, compared, verdict

HEADERS = ("variant", "status", "size", "worst metric", "seconds", "cached/ran")


@dataclass
class Row:
    variant: str
    status: str  # the verdict's words (validation passed / failed, built, not validated), or error (a stage failed)
    size: int | None
    worst: str  # "cosine 0.99998 (limit 0.9999)", "" when nothing was measured
    seconds: float
    cached: int
    ran: int

    def cells(self) -> tuple[str, ...]:
        return (self.variant, self.status, human_bytes(self.size) if self.size is not None else "—",
                self.worst or "—", f"{self.seconds:.1f}", f"{self.cached}/{self.ran}")


def rows(records: list[dict]) -> list[Row]:
    """One row per variant record of ``run --json``."""
    return [_row(record) for record in records]


def _row(record: dict) -> Row:
    stages = record.get("stages") or []
    sizes = record.get("artifact_sizes") or {}
    validation = record.get("validation") or {}
    status = "error" if record.get("error") else verdict(
        failed=record.get("status") == "failed", validated=compared(validation.get("runtimes") or {}))
    return Row(
        variant=f"{record['recipe']}:{record['variant']}",
        status=status,
        size=sum(sizes.values()) if sizes else None,
        worst=worst_metric(validation),
        seconds=round(sum(s.get("seconds") or 0.0 for s in stages), 2),
        cached=sum(s.get("status") == "cached" for s in stages),
        ran=sum(s.get("status") == "ran" for s in stages),
    )


def worst_metric(validation: dict) -> str:
    """The metric closest to (or furthest past) its limit, with its value: a failed limit first;
    with no limits, the worst cosine (else max abs error) measured."""
    failures = validation.get("failures") or []
    if failures:
        first = failures[0]
        return _shown(first.get("metric"), first.get("value"), first.get("limit"), missed=True)
    closest = None  # (share of the limit used, metric, value, limit)
    unlimited: dict[str, float] = {}
    for record in (validation.get("runtimes") or {}).values():
        if not isinstance(record, dict):
            continue
        metrics, limits = record.get("metrics") or {}, record.get("limits") or {}
        for output, values in metrics.items():
            for threshold, limit in (limits.get(output) or {}).items():
                metric, _, side = threshold.rpartition("_")
                value = _worst(values.get(metric), side)
                share = _share(metric, side, value, limit)
                if share is not None and (closest is None or share > closest[0]):
                    closest = (share, metric, value, limit)
            for metric in ("cosine", "max_abs"):
                value = _worst(values.get(metric), "min" if metric == "cosine" else "max")
                if value is not None and (metric not in unlimited or
                                          (value < unlimited[metric] if metric == "cosine" else value > unlimited[metric])):
                    unlimited[metric] = value
    if closest is not None:
        _, metric, value, limit = closest
        return _shown(metric, value, limit)
    for metric in ("cosine", "max_abs"):
        if metric in unlimited:
            return _shown(metric, unlimited[metric])
    return ""


def _shown(metric, value, limit=None, *, missed: bool = False) -> str:
    """``max_abs 0.002 (limit 0.01)``; a cosine as 1 − cosine, as the report pages show it
    (0.9999998 would print as 1)."""
    if metric in COSINES and isinstance(value, (int, float)):
        metric, value = f"1 − {metric}", 1.0 - value
        limit = 1.0 - limit if isinstance(limit, (int, float)) else limit
    text = f"{metric} {_number(value)}"
    if limit is not None:
        text += f" (limit {_number(limit)}{', missed' if missed else ''})"
    return text


def _worst(stats, side: str):
    """The statistic a ``*_min`` / ``*_max`` limit is usually held to: the lowest / highest sample."""
    if not isinstance(stats, dict):
        return None
    value = stats.get(side)
    return value if isinstance(value, (int, float)) and not math.isnan(value) else None


def _share(metric: str, side: str, value, limit) -> float | None:
    """How much of the room a limit gives is used: 1 at the limit, above 1 past it."""
    if value is None or not isinstance(limit, (int, float)):
        return None
    if side == "max":
        return value / limit if limit > 0 else (math.inf if value > 0 else 0.0)
    if metric in COSINES:  # cosine 0.99998 against 0.9999: 2e-5 of 1e-4
        room = 1.0 - limit
        return (1.0 - value) / room if room > 0 else (math.inf if value < limit else 0.0)
    return limit / value if value > 0 else math.inf


def _number(value) -> str:
    return f"{value:.3g}" if isinstance(value, (int, float)) else str(value)


def plain_lines(table: list[Row]) -> list[str]:
    """The table as aligned text lines (CI logs, pipes, the replay of a repeated run)."""
    cells = [HEADERS, *(row.cells() for row in table)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(HEADERS))]
    numeric = {2, 4, 5}  # right-aligned columns
    return ["  ".join(c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths))).rstrip()
            for line in cells]


def print_summary(display, records: list[dict]) -> None:
    """Draw the table on ``display`` (a report.console printer): a rich table on a live terminal."""
    table = rows(records)
    if getattr(display, "quiet", False):
        return
    if isinstance(display, LivePrinter):
        from rich.table import Table

        colours = {PASSED: "green", NOT_VALIDATED: "yellow", FAILED: "red", "error": "red"}
        drawn = Table(*HEADERS, title="variants", title_justify="left")
        for column in (2, 4, 5):
            drawn.columns[column].justify = "right"
        for row in table:
            cells = [escape(cell) for cell in row.cells()]
            cells[1] = f"[{colours.get(row.status, 'yellow')}]{cells[1]}[/]"
            drawn.add_row(*cells)
        display.print(drawn)
        return
    for line in plain_lines(table):
        display.print(escape(line))
