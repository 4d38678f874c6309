"""Small inline SVG charts for the HTML report: no scripts, no external resources.

Each function returns an ``<svg>`` element as a string, sized in CSS pixels, with every
label escaped. Colours come from CSS classes defined in ``html.py`` so the charts follow the
page's theme.
"""

from __future__ import annotations

import math
from html import escape
from typing import Sequence

FONT = 11


def grouped_bars(rows: Sequence[tuple[str, float, float]], *, labels: tuple[str, str], unit_format, width: int = 760) -> str:
    """Horizontal pairs of bars, one pair per ``(name, before, after)`` row."""
    if not rows:
        return ""
    label_w, right_pad, bar_h, gap, top = 220, 90, 8, 10, 24
    plot_w = width - label_w - right_pad
    peak = max(max(before, after) for _, before, after in rows) or 1.0
    height = top + len(rows) * (2 * bar_h + gap) + 6
    parts = [_open(width, height, "bar chart of sizes before and after compression")]
    parts.append(_legend([(labels[0], "before"), (labels[1], "after")], x=label_w, y=14))
    for i, (name, before, after) in enumerate(rows):
        y = top + i * (2 * bar_h + gap)
        parts.append(_text(label_w - 6, y + bar_h + 3, _clip(name, 34), anchor="end", title=name))
        for j, (value, cls) in enumerate(((before, "before"), (after, "after"))):
            w = max(plot_w * value / peak, 0.5 if value else 0)
            by = y + j * bar_h
            parts.append(f'<rect class="{cls}" x="{label_w}" y="{by}" width="{w:.1f}" height="{bar_h - 1}"><title>{escape(name)}: {escape(unit_format(value))}</title></rect>')
            parts.append(_text(label_w + w + 4, by + bar_h - 1, unit_format(value), size=FONT - 2))
    parts.append("</svg>")
    return "".join(parts)


def histogram(counts: Sequence[int], edges: Sequence[float], *, title: str, width: int = 440, height: int = 180) -> str:
    """Bars of the share of elements per ``|error|`` bin; ``edges`` are log-spaced bin bounds
    (``counts`` has one more entry than ``edges``: below the first, from the last)."""
    total = sum(counts)
    if total == 0:
        return ""
    left, bottom, top, right = 44, 34, 10, 10
    plot_w, plot_h = width - left - right, height - top - bottom
    n = len(counts)
    bar_w = plot_w / n
    peak = max(counts) / total
    parts = [_open(width, height, title)]
    parts.append(f'<line class="axis" x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}"/>')
    for frac in (0.5, 1.0):
        y = top + plot_h * (1 - frac)
        parts.append(f'<line class="grid" x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}"/>')
        parts.append(_text(left - 4, y + 4, f"{peak * frac:.0%}", anchor="end", size=FONT - 2))
    for i, count in enumerate(counts):
        share = count / total
        h = plot_h * share / peak if peak else 0
        x = left + i * bar_w
        lo = "0" if i == 0 else f"{edges[i - 1]:.0e}"
        hi = f"{edges[i]:.0e}" if i < len(edges) else "inf"
        parts.append(
            f'<rect class="bar" x="{x + 0.5:.1f}" y="{top + plot_h - h:.1f}" width="{max(bar_w - 1, 0.5):.1f}" height="{h:.1f}">'
            f"<title>[{lo}, {hi}): {count} ({share:.2%})</title></rect>"
        )
    for i, edge in enumerate(edges):  # a tick at each decade
        exponent = math.log10(edge)
        if abs(exponent - round(exponent)) < 1e-9 and round(exponent) % 2 == 1:
            x = left + (i + 1) * bar_w
            parts.append(f'<line class="axis" x1="{x:.1f}" y1="{top + plot_h}" x2="{x:.1f}" y2="{top + plot_h + 4}"/>')
            parts.append(_text(x, top + plot_h + 15, f"1e{round(exponent)}", anchor="middle", size=FONT - 2))
    parts.append(_text(left + plot_w / 2, height - 4, "|candidate - reference|", anchor="middle", size=FONT - 1))
    parts.append("</svg>")
    return "".join(parts)


def scatter(points: Sequence[tuple[str, float, float, bool]], *, x_label: str, y_label: str, log_y: bool = True,
            width: int = 640, height: int = 360) -> str:
    """Labelled points ``(label, x, y, ok)``; ``ok`` picks the pass/fail colour."""
    if not points:
        return ""
    left, bottom, top, right = 64, 40, 16, 120
    plot_w, plot_h = width - left - right, height - top - bottom
    # On a log axis an exact 0 sits one decade below the smallest non-zero value.
    positive = [p[2] for p in points if p[2] > 0]
    floor = min(positive) / 10 if positive else 1e-9
    xs = [p[1] for p in points]
    ys = [math.log10(max(p[2], floor)) if log_y else p[2] for p in points]
    x_lo, x_hi = _padded_range(0.0, max(xs))
    y_lo, y_hi = _padded_range(min(ys), max(ys))
    if log_y:
        y_lo, y_hi = math.floor(y_lo), math.ceil(y_hi)

    def px(x):
        return left + plot_w * (x - x_lo) / (x_hi - x_lo)

    def py(y):
        return top + plot_h * (1 - (y - y_lo) / (y_hi - y_lo))

    parts = [_open(width, height, f"{y_label} against {x_label}")]
    parts.append(f'<rect class="frame" x="{left}" y="{top}" width="{plot_w}" height="{plot_h}"/>')
    for tick in _ticks(x_lo, x_hi):
        parts.append(f'<line class="grid" x1="{px(tick):.1f}" y1="{top}" x2="{px(tick):.1f}" y2="{top + plot_h}"/>')
        parts.append(_text(px(tick), top + plot_h + 14, f"{tick:g}", anchor="middle", size=FONT - 2))
    y_ticks = range(int(y_lo), int(y_hi) + 1) if log_y else _ticks(y_lo, y_hi)
    for tick in y_ticks:
        parts.append(f'<line class="grid" x1="{left}" y1="{py(tick):.1f}" x2="{left + plot_w}" y2="{py(tick):.1f}"/>')
        parts.append(_text(left - 4, py(tick) + 4, f"1e{tick}" if log_y else f"{tick:g}", anchor="end", size=FONT - 2))
    for (label, x, y_raw, ok), y in zip(points, ys):
        cls = "pass" if ok else "fail"
        parts.append(f'<circle class="{cls}" cx="{px(x):.1f}" cy="{py(y):.1f}" r="5"><title>{escape(label)}: {x:g}, {y_raw:.4g}</title></circle>')
        parts.append(_text(px(x) + 8, py(y) + 4, f"{label} (0)" if log_y and y_raw <= 0 else label))
    parts.append(_text(left + plot_w / 2, height - 6, x_label, anchor="middle"))
    parts.append(f'<text class="label" font-size="{FONT}" transform="translate(14 {top + plot_h / 2}) rotate(-90)" text-anchor="middle">{escape(y_label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def step_gaps(series: Sequence[tuple[str, Sequence[float], int | None]], *, steps: int | None = None,
              x_label: str = "generated step", y_label: str = "1 − cosine of the step's logits",
              width: int = 640, height: int = 300) -> str:
    """One line per ``(label, cosines per step, marked step)`` series, plotting 1 − cosine on a log axis
    (an exact 1 sits a decade below the smallest gap); the marked step (a first divergence) is a ring.
    ``steps``: the x axis' length (default: the longest series), so a series cut short shows as such."""
    lines = [(label, [1.0 - c if c == c else math.nan for c in cosines], mark) for label, cosines, mark in series]
    gaps = [g for _, values, _ in lines for g in values if g == g]
    if not gaps:
        return ""
    left, bottom, top, right = 64, 40, 16, 150
    plot_w, plot_h = width - left - right, height - top - bottom
    positive = [g for g in gaps if g > 0]
    floor = min(positive) / 10 if positive else 1e-12
    logs = [math.log10(max(g, floor)) for g in gaps]
    y_lo, y_hi = math.floor(min(logs)), math.ceil(max(logs))
    if y_hi == y_lo:
        y_hi += 1
    steps = max([len(values) for _, values, _ in lines] + [steps or 0])
    x_hi = max(steps - 1, 1)

    def px(step):
        return left + plot_w * step / x_hi

    def py(gap):
        return top + plot_h * (1 - (math.log10(max(gap, floor)) - y_lo) / (y_hi - y_lo))

    parts = [_open(width, height, f"{y_label} per {x_label}")]
    parts.append(f'<rect class="frame" x="{left}" y="{top}" width="{plot_w}" height="{plot_h}"/>')
    for tick in _ticks(0, x_hi):
        if tick == int(tick):
            parts.append(f'<line class="grid" x1="{px(tick):.1f}" y1="{top}" x2="{px(tick):.1f}" y2="{top + plot_h}"/>')
            parts.append(_text(px(tick), top + plot_h + 14, f"{tick:g}", anchor="middle", size=FONT - 2))
    for tick in range(y_lo, y_hi + 1):
        y = top + plot_h * (1 - (tick - y_lo) / (y_hi - y_lo))
        parts.append(f'<line class="grid" x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}"/>')
        parts.append(_text(left - 4, y + 4, f"1e{tick}", anchor="end", size=FONT - 2))
    for i, (label, values, mark) in enumerate(lines):
        cls = f"series s{i % SERIES_COLOURS}"
        points = " ".join(f"{px(step):.1f},{py(gap):.1f}" for step, gap in enumerate(values) if gap == gap)
        parts.append(f'<polyline class="{cls}" points="{points}"><title>{escape(label)}</title></polyline>')
        for step, gap in enumerate(values):
            if gap == gap:
                parts.append(f'<circle class="{cls}" cx="{px(step):.1f}" cy="{py(gap):.1f}" r="2.5">'
                             f"<title>{escape(label)}, step {step}: 1 − cosine {gap:.3e}</title></circle>")
        if mark is not None and mark < len(values) and values[mark] == values[mark]:
            parts.append(f'<circle class="divergence" cx="{px(mark):.1f}" cy="{py(values[mark]):.1f}" r="6">'
                         f"<title>{escape(label)}: first divergent token at step {mark}</title></circle>")
        ly = top + 12 + 16 * i
        parts.append(f'<line class="{cls}" x1="{left + plot_w + 10}" y1="{ly - 4}" x2="{left + plot_w + 26}" y2="{ly - 4}"/>')
        parts.append(_text(left + plot_w + 30, ly, _clip(label, 18), title=label))
    parts.append(_text(left + plot_w / 2, height - 6, x_label, anchor="middle"))
    parts.append(f'<text class="label" font-size="{FONT}" transform="translate(14 {top + plot_h / 2}) rotate(-90)" text-anchor="middle">{escape(y_label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


SERIES_COLOURS = 6  # CSS classes s0..s5 in html.py


def _open(width: int, height: int, title: str) -> str:
    return f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img"><title>{escape(title)}</title>'


def _legend(entries, *, x: float, y: float) -> str:
    parts = []
    for label, cls in entries:
        parts.append(f'<rect class="{cls}" x="{x}" y="{y - 9}" width="10" height="10"/>')
        parts.append(_text(x + 14, y, label))
        x += 30 + 7 * len(label)
    return "".join(parts)


def _text(x: float, y: float, text: str, *, anchor: str = "start", size: int = FONT, title: str | None = None) -> str:
    tip = f"<title>{escape(title)}</title>" if title and title != text else ""
    return f'<text class="label" x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}">{tip}{escape(text)}</text>'


def _clip(text: str, length: int) -> str:
    return text if len(text) <= length else "…" + text[-(length - 1):]


def _padded_range(lo: float, hi: float) -> tuple[float, float]:
    if hi == lo:
        return lo - 1, hi + 1
    pad = 0.08 * (hi - lo)
    return lo - (pad if lo != 0 else 0), hi + pad


def _ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    raw = (hi - lo) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.ceil(lo / step) * step
    return [round(first + i * step, 10) for i in range(int((hi - first) / step) + 1)]
