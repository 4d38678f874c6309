"""HTML pages for a variant's report and for the comparison of a recipe's variants.

Self-contained: inline CSS and inline SVG, no scripts, nothing fetched, so the file opens
offline and can be attached to a CI run. Every section tolerates missing data (see
``report.py`` for the shape of ``data``).
"""

from __future__ import annotations

import math
from html import escape
from typing import Any, Iterable, Mapping, Sequence

from edgebuild.verify import svg
from edgebuild.verify.metrics import STATISTICS
from edgebuild.verify.thresholds import metric_of

MAX_LAYERS_IN_CHART = 25
MAX_PLAN_ROWS = 400

CSS = """
:root { --fg:#1d2430; --muted:#5b6575; --line:#d9dee7; --bg:#ffffff; --panel:#f6f8fb;
        --pass:#1f883d; --pass-bg:#e6f4ea; --fail:#cf222e; --fail-bg:#fdecea; --before:#9aa5b8; --after:#2f6fdd; }
* { box-sizing: border-box; }
body { font: 14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: var(--fg);
       background: var(--bg); margin: 0 auto; padding: 24px 32px 48px; max-width: 1180px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 32px 0 10px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 14px; margin: 18px 0 6px; }
.sub { color: var(--muted); margin: 0 0 16px; }
table { border-collapse: collapse; margin: 6px 0 12px; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid var(--line); padding: 4px 9px; text-align: left; vertical-align: top; }
th { background: var(--panel); font-weight: 600; }
td.num { text-align: right; }
.badge { display: inline-block; padding: 1px 9px; border-radius: 10px; font-weight: 600; font-size: 12px; }
.ok, td.ok { background: var(--pass-bg); color: var(--pass); }
.bad, td.bad { background: var(--fail-bg); color: var(--fail); }
.neutral { background: var(--panel); color: var(--muted); }
.cards { display: flex; flex-wrap: wrap; gap: 10px; }
.card { background: var(--panel); border: 1px solid var(--line); border-radius: 6px; padding: 8px 14px; min-width: 150px; }
.card .k { color: var(--muted); font-size: 12px; } .card .v { font-size: 16px; font-weight: 600; word-break: break-all; }
.failures li { color: var(--fail); }
.muted { color: var(--muted); }
.grid-2 { display: flex; flex-wrap: wrap; gap: 18px; }
.chart { display: block; background: #fff; }
.chart .label { fill: var(--fg); font-family: inherit; }
.chart .axis { stroke: var(--muted); } .chart .grid { stroke: #eceff4; } .chart .frame { fill: none; stroke: var(--line); }
.chart .bar { fill: var(--after); } .chart .before { fill: var(--before); } .chart .after { fill: var(--after); }
.chart .pass { fill: var(--pass); } .chart .fail { fill: var(--fail); }
code { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; }
"""


def render_report(data: Mapping[str, Any]) -> str:
    """The page for one variant."""
    title = " / ".join(str(part) for part in (data.get("recipe"), data.get("variant")) if part) or "edgebuild report"
    sections = [
        _summary(data),
        _stages(data.get("stages")),
        _sizes(data.get("sizes")),
        _numerics(data.get("validation")),
        _plan(data.get("plan")),
        _fusion_rules(data.get("optimize")),
        _notes(data.get("notes")),
    ]
    return _page(title, f"<h1>{escape(title)}</h1>" + "".join(s for s in sections if s))


def render_combined(reports: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """The page comparing variants; ``reports`` is ``[(link to the variant's page, its data)]``."""
    recipes = sorted({str(data.get("recipe")) for _, data in reports if data.get("recipe")})
    title = f"{', '.join(recipes) or 'edgebuild'}: variants"
    points, rows = [], []
    for link, data in reports:
        name = str(data.get("variant") or link.split("/")[0])
        size = _artifact_size(data)
        errors = worst_metrics(data.get("validation"))
        ok = _status_ok(data)
        if size is not None and errors.get("max_abs") is not None:
            points.append((name, size / 1e6, errors["max_abs"], ok))
        rows.append([
            f'<a href="{escape(link)}">{escape(name)}</a>',
            _badge(data.get("status")),
            _cell(_bytes(size)),
            _cell(_ratio(data)),
            _cell(_num(errors.get("cosine"))),
            _cell(_num(errors.get("max_abs"))),
            _cell(_num(errors.get("snr_db"))),
            _cell(_num(errors.get("top1_agreement"))),
            _cell(str(_failure_count(data.get("validation")))),
        ])
    body = [f"<h1>{escape(title)}</h1><p class=sub>{len(reports)} variant(s). Errors are the worst over outputs and samples.</p>"]
    chart = svg.scatter(points, x_label="artifact size (MB)", y_label="worst max |error|")
    if chart:
        body.append("<h2>Size against error</h2>" + chart)
    headers = ["variant", "status", "size", "compression", "cosine (min)", "max abs (max)", "SNR dB (min)", "top-1 (min)", "failures"]
    body.append("<h2>Variants</h2>" + _table(headers, rows, raw=True))
    return _page(title, "".join(body))


def worst_metrics(validation: Mapping[str, Any] | None) -> dict[str, float]:
    """Worst value of a few headline metrics over every runtime, output and sample."""
    worst: dict[str, float] = {}
    for runtime in _runtimes(validation).values():
        for metrics in (runtime.get("metrics") or {}).items():
            for metric, stats in metrics[1].items():
                side = "max" if metric in ("max_abs", "mean_abs", "p99_abs", "max_rel", "nonfinite") else "min"
                value = _as_float(stats.get(side)) if isinstance(stats, Mapping) else None
                if value is None or math.isnan(value):
                    continue
                current = worst.get(metric)
                if current is None or (value > current if side == "max" else value < current):
                    worst[metric] = value
    return worst


# -- sections -----------------------------------------------------------------------------

def _summary(data) -> str:
    artifact = data.get("artifact") or {}
    cards = [("recipe", data.get("recipe")), ("variant", data.get("variant")), ("status", None),
             ("artifact", artifact.get("path")), ("size", _bytes(_artifact_size(data))), ("compression", _ratio(data))]
    html = ['<div class="cards">']
    for key, value in cards:
        if key == "status":
            html.append(f'<div class="card"><div class="k">status</div><div class="v">{_badge(data.get("status"))}</div></div>')
        elif value not in (None, "", "—"):
            html.append(f'<div class="card"><div class="k">{key}</div><div class="v">{escape(str(value))}</div></div>')
    html.append("</div>")
    extra = [(k, data.get(k)) for k in ("recipe_path", "source", "target", "created", "edgebuild_version") if data.get(k)]
    if extra:
        html.append(_table(["", ""], [[k, _short(v)] for k, v in extra], header=False))
    return "<h2>Summary</h2>" + "".join(html)


def _stages(stages) -> str:
    if not stages:
        return ""
    rows, total = [], 0.0
    for stage in stages:
        seconds = stage.get("seconds")
        total += seconds if isinstance(seconds, (int, float)) else 0.0
        status = str(stage.get("status", ""))
        rows.append([escape(str(stage.get("name", ""))), _badge(status, good=("ran", "cached")),
                     f'<span class=num>{_num(seconds, 3)}</span>', f'<code>{escape(str(stage.get("key", ""))[:16])}</code>'])
    rows.append(["<b>total</b>", "", f"<b>{_num(total, 3)}</b>", ""])
    return "<h2>Stages</h2>" + _table(["stage", "status", "seconds", "key"], rows, raw=True)


def _sizes(sizes) -> str:
    layers = (sizes or {}).get("layers") or []
    if not layers:
        return ""
    ordered = sorted(layers, key=lambda layer: -(layer.get("before_bytes") or 0))
    shown = [(str(l.get("name")), float(l.get("before_bytes") or 0), float(l.get("after_bytes") or 0)) for l in ordered[:MAX_LAYERS_IN_CHART]]
    rest = ordered[MAX_LAYERS_IN_CHART:]
    if rest:
        shown.append((f"({len(rest)} other layers)", float(sum(l.get("before_bytes") or 0 for l in rest)),
                      float(sum(l.get("after_bytes") or 0 for l in rest))))
    before = sum(l.get("before_bytes") or 0 for l in layers)
    after = sum(l.get("after_bytes") or 0 for l in layers)
    ratio = f" ({before / after:.2f}x smaller)" if after else ""
    chart = svg.grouped_bars(shown, labels=("before", "after"), unit_format=lambda v: _bytes(v) or "0")
    return (f"<h2>Weights per layer</h2><p class=sub>{len(layers)} layers: {_bytes(before)} before, "
            f"{_bytes(after)} after compression{ratio}.</p>{chart}")


def _numerics(validation) -> str:
    runtimes = _runtimes(validation)
    if not runtimes:
        return ""
    samples = (validation or {}).get("samples")
    reference = (validation or {}).get("reference")
    intro = ", ".join(x for x in (f"{samples} samples" if samples else "", f"reference: {reference}" if reference else "") if x)
    html = [f"<h2>Numerics</h2><p class=sub>{escape(intro)}</p>" if intro else "<h2>Numerics</h2>"]
    for name, runtime in runtimes.items():
        html.append(f"<h3>candidate: {escape(name)}</h3>")
        if runtime.get("skipped"):
            html.append(f'<p class="muted">skipped: {escape(str(runtime["skipped"]))}</p>')
            continue
        failures = runtime.get("failures") or []
        if failures:
            html.append('<ul class="failures">' + "".join(f"<li>{escape(_failure_text(f))}</li>" for f in failures) + "</ul>")
        limits = runtime.get("limits") or (validation or {}).get("limits") or {}
        for output, metrics in (runtime.get("metrics") or {}).items():
            html.append(f"<h3>output <code>{escape(output)}</code></h3>")
            html.append('<div class="grid-2">' + _metric_table(metrics, limits.get(output) or {}, failures, output))
            hist = (runtime.get("histograms") or {}).get(output)
            if hist:
                html.append(svg.histogram(hist.get("counts") or [], hist.get("edges") or [], title=f"|error| histogram of {output}"))
            html.append("</div>")
    return "".join(html)


def _metric_table(metrics, limits, failures, output) -> str:
    by_metric = {}
    for threshold, limit in limits.items():
        metric, side = metric_of(threshold)
        by_metric[metric] = (threshold, side, limit)
    failed = {_field(f, "metric") for f in failures if _field(f, "output") == output}
    for failure in failures:  # limits not passed in: recover them from the failures
        metric, limit, value = _field(failure, "metric"), _as_float(_field(failure, "limit")), _as_float(_field(failure, "value"))
        if _field(failure, "output") == output and metric not in by_metric and None not in (limit, value):
            side = "min" if value < limit else "max"
            by_metric[metric] = (f"{metric}_{side}", side, limit)
    rows = []
    for metric, stats in metrics.items():
        stats = stats if isinstance(stats, Mapping) else {}
        threshold, side, limit = by_metric.get(metric, (None, None, None))
        worst_key = side or ("min" if metric in ("cosine", "snr_db") or metric.startswith("top") else "max")
        if metric == "nonfinite":
            limit_text, verdict = "= 0", ("bad" if metric in failed else "ok")
        elif threshold is None:
            limit_text, verdict = "—", ""
        else:
            limit_text = f"{'≥' if side == 'min' else '≤'} {_num(limit)}"
            verdict = "bad" if metric in failed else "ok"
        cells = [f"<td>{escape(metric)}</td>"]
        for stat in STATISTICS:
            cls = f"num {verdict}" if stat == worst_key and verdict else "num"
            cells.append(f'<td class="{cls}">{_num(stats.get(stat))}</td>')
        result = {"ok": "pass", "bad": "FAIL"}.get(verdict, "")
        cells.append(f'<td class="num">{escape(limit_text)}</td><td class="{verdict}">{result}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("metric", *STATISTICS, "limit", "result"))
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _plan(plan) -> str:
    if not plan:
        return ""
    html = ["<h2>Compute plan</h2>"]
    if plan.get("total_ms") is not None:
        html.append(f"<p class=sub>estimated total: {_num(plan.get('total_ms'))} ms</p>")
    breakdown = plan.get("breakdown") or {}
    if breakdown:
        html.append("<h3>breakdown</h3>" + _mapping_table(breakdown, key_header="unit"))
    ops = plan.get("ops") or []
    if ops:
        columns = _columns(ops)
        rows = [[_short(op.get(c)) for c in columns] for op in ops[:MAX_PLAN_ROWS]]
        html.append(f"<h3>ops ({len(ops)})</h3>" + _table(columns, rows))
        if len(ops) > MAX_PLAN_ROWS:
            html.append(f'<p class="muted">{len(ops) - MAX_PLAN_ROWS} more ops in report.json</p>')
    return "".join(html)


def _fusion_rules(optimize) -> str:
    rules = (optimize or {}).get("rules") if isinstance(optimize, Mapping) else None
    if not rules:
        return ""
    if isinstance(rules, Mapping):
        rows = [[str(name), _short(count)] for name, count in rules.items()]
        return "<h2>Fusion rules fired</h2>" + _table(["rule", "times"], rows)
    if all(isinstance(rule, Mapping) for rule in rules):
        columns = _columns(rules)
        return "<h2>Fusion rules fired</h2>" + _table(columns, [[_short(r.get(c)) for c in columns] for r in rules])
    return "<h2>Fusion rules fired</h2><ul>" + "".join(f"<li>{escape(str(r))}</li>" for r in rules) + "</ul>"


def _notes(notes) -> str:
    if not notes:
        return ""
    notes = [notes] if isinstance(notes, str) else notes
    return "<h2>Notes</h2><ul>" + "".join(f"<li>{escape(str(n))}</li>" for n in notes) + "</ul>"


# -- helpers ------------------------------------------------------------------------------

def _page(title: str, body: str) -> str:
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head>'
            f"<body>{body}</body></html>\n")


def _runtimes(validation) -> dict[str, Mapping[str, Any]]:
    if not isinstance(validation, Mapping):
        return {}
    if validation.get("runtimes"):
        return dict(validation["runtimes"])
    if validation.get("metrics"):
        return {str(validation.get("runtime", "candidate")): validation}
    return {}


def _as_float(value):
    """Numbers, and the "inf"/"-inf"/"nan" strings report.json uses for non-finite ones."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if value in ("inf", "-inf", "nan"):
        return float(value)
    return None


def _failure_count(validation) -> int:
    return sum(len(r.get("failures") or []) for r in _runtimes(validation).values())


def _failure_text(failure) -> str:
    return str(_field(failure, "message") or failure)


def _field(failure, name):
    return failure.get(name) if isinstance(failure, Mapping) else getattr(failure, name, None)


def _status_ok(data) -> bool:
    return str(data.get("status", "")).lower() in ("passed", "built", "ok", "success") and not _failure_count(data.get("validation"))


def _artifact_size(data):
    size = (data.get("artifact") or {}).get("size_bytes")
    return size if isinstance(size, (int, float)) else None


def _ratio(data) -> str:
    layers = (data.get("sizes") or {}).get("layers") or []
    before = sum(l.get("before_bytes") or 0 for l in layers)
    after = sum(l.get("after_bytes") or 0 for l in layers)
    return f"{before / after:.2f}x" if before and after else "—"


def _badge(status, good=("passed", "built", "ok", "success", "ran", "cached")) -> str:
    text = str(status or "unknown")
    lowered = text.lower()
    cls = "ok" if lowered in good else "bad" if lowered in ("failed", "error", "fail") else "neutral"
    return f'<span class="badge {cls}">{escape(text)}</span>'


def _bytes(size) -> str:
    if not isinstance(size, (int, float)):
        return "—"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(size) < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1000
    return ""


def _num(value, digits: int = 4) -> str:
    if isinstance(value, str):  # report.json writes inf/nan as strings
        return escape(value)
    if not isinstance(value, (int, float)):
        return "—"
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else "-inf" if value < 0 else "nan"
    return f"{value:.{digits}g}"


def _cell(text: str) -> str:
    return escape(text)


def _short(value) -> str:
    if isinstance(value, float):
        return _num(value)
    if isinstance(value, (list, tuple)):
        return ", ".join(_short(v) for v in value)
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {_short(v)}" for k, v in value.items())
    return "" if value is None else str(value)


def _columns(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    return columns


def _mapping_table(mapping: Mapping[str, Any], *, key_header: str) -> str:
    values = list(mapping.values())
    if values and all(isinstance(v, Mapping) for v in values):
        columns = _columns(values)
        return _table([key_header, *columns], [[str(k), *(_short(v.get(c)) for c in columns)] for k, v in mapping.items()])
    return _table([key_header, "value"], [[str(k), _short(v)] for k, v in mapping.items()])


def _table(headers, rows, *, raw: bool = False, header: bool = True) -> str:
    """``raw`` cells are trusted HTML built here; others are escaped."""
    head = "<tr>" + "".join(f"<th>{escape(str(h))}</th>" for h in headers) + "</tr>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{c if raw else escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table>{head}{body}</table>"
