"""HTML pages for a variant's report and for the comparison of a recipe's variants.

Self-contained: inline CSS and inline SVG, no scripts, nothing fetched, so the file opens
offline and can be attached to a CI run. The pages read ``report_schema.Report``, the same
schema the build writes; every section is optional.
"""

from __future__ import annotations

import math
from html import escape
from urllib.parse import quote
from typing import Any, Iterable, Mapping, Sequence

from edgebuild.report import svg
from edgebuild.report.schema import Compression, Failure, OptimizeRecord, Report, RuntimeRecord, Validation
from edgebuild.report.verdict import FAILED, PASSED
from edgebuild.verify.thresholds import metric_of, statistic_key

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
.chart .series { fill: none; stroke-width: 1.5; } .chart circle.series { stroke: none; }
.chart .s0 { stroke: #2f6fdd; } .chart .s1 { stroke: #d97706; } .chart .s2 { stroke: #7c3aed; }
.chart .s3 { stroke: #0f9d8a; } .chart .s4 { stroke: #db2777; } .chart .s5 { stroke: #5b6575; }
.chart circle.s0 { fill: #2f6fdd; } .chart circle.s1 { fill: #d97706; } .chart circle.s2 { fill: #7c3aed; }
.chart circle.s3 { fill: #0f9d8a; } .chart circle.s4 { fill: #db2777; } .chart circle.s5 { fill: #5b6575; }
.chart .divergence { fill: none; stroke: var(--fail); stroke-width: 2; }
code { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; }
details summary { cursor: pointer; color: var(--muted); margin: 4px 0; }
ul.failures { margin: 0; padding-left: 18px; }
"""


LOWER_IS_BETTER = ("max_abs", "mean_abs", "p90_abs", "p99_abs", "max_rel", "nonfinite", "noise_ratio",
                   "fp32_reference_max_abs")
COSINES = ("cosine", "fp32_reference_cosine", "step_cosine")  # shown as 1 − cosine
# metrics measured on the fp32 reference rather than the candidate (validate.reference: float64)
LABELS = {"fp32_reference_cosine": "1 − cosine, onnxruntime fp32 vs float64",
          "fp32_reference_max_abs": "max_abs, onnxruntime fp32 vs float64",
          "noise_ratio": "noise ratio (max_abs / onnxruntime's)",
          "step_cosine": "1 − cosine of a step's logits (generation)",
          "token_agreement": "greedy token agreement (per prompt)"}


def render_report(data: Report | Mapping[str, Any]) -> str:
    """The page for one variant."""
    report = data if isinstance(data, Report) else Report.model_validate(data)
    title = " / ".join(str(part) for part in (report.recipe, report.variant) if part) or "edgebuild report"
    sections = [
        _summary(report),
        _warnings(report),
        _stages(report),
        _compression(report),
        _numerics(report.validation),
        _plan(report.plan),
        _quantization(report.optimize),
        _optimize_level(report.optimize.model_dump() if report.optimize else None),
        _fusion_rules(report.optimize.model_dump() if report.optimize else None),
        _renamings(report.renamings),
        _notes(report.notes),
    ]
    heading = f"<h1>{escape(title)} {_verdict_badge(report)}</h1>"
    return _page(title, heading + "".join(s for s in sections if s))


def relative_href(path: str) -> str:
    """A relative URL for the file ``path`` (``/``-separated, relative to the page): every segment
    percent-quoted and a leading ``./``, so no folder name can become a scheme
    (``javascript:...``), a host, a query or a fragment."""
    segments = [quote(part, safe="") for part in str(path).split("/") if part]
    if not segments or segments[0] not in (".", ".."):
        segments.insert(0, ".")
    return "/".join(segments)


def render_combined(reports: Sequence[tuple[str, Report | Mapping[str, Any]]]) -> str:
    """The page comparing variants; ``reports`` is ``[(link to the variant's page, its report)]``."""
    reports = [(link, r if isinstance(r, Report) else Report.model_validate(r)) for link, r in reports]
    recipes = sorted({str(r.recipe) for _, r in reports if r.recipe})
    title = f"{', '.join(recipes) or 'edgebuild'}: variants"
    several = len(recipes) > 1
    points, rows = [], []
    for link, report in reports:
        name = str(report.variant or link.split("/")[0])
        name = f"{report.recipe} / {name}" if several else name
        size = _artifact_size(report)
        errors = worst_metrics(report.validation)
        if size is not None and errors.get("max_abs") is not None:
            points.append((name, size / 1e6, errors["max_abs"], report.status != "failed"))
        rows.append([
            f'<a href="{escape(relative_href(link))}">{escape(name)}</a>',
            _verdict_badge(report),
            _cell(human_bytes(size)),
            _cell(_weights_ratio(report)),
            _cell(_one_minus(errors.get("cosine"))),
            _cell(_num(errors.get("max_abs"))),
            _cell(_num(errors.get("snr_db"))),
            _cell(_num(errors.get("top1_agreement"))),
            _failures_cell(report),
        ])
    body = [f"<h1>{escape(title)}</h1><p class=sub>{len(reports)} variant(s). Errors are the worst over outputs, "
            "runtimes and samples.</p>"]
    chart = svg.scatter(points, x_label="artifact size (MB)", y_label="worst max |error|")
    if chart:
        body.append("<h2>Size against error</h2>" + chart)
    headers = ["variant", "result", "size", "weights", "1 − cosine (worst)", "max abs (worst)", "SNR dB (worst)",
               "top-1 (worst)", "limits missed"]
    body.append("<h2>Variants</h2>" + _table(headers, rows, raw=True))
    return _page(title, "".join(body))


def worst_metrics(validation: Validation | None) -> dict[str, float]:
    """Worst value of each metric over every runtime, output and sample."""
    worst: dict[str, float] = {}
    for runtime in (validation.runtimes.values() if validation else ()):
        for metrics in runtime.metrics.values():
            for metric, stats in metrics.items():
                side = "max" if metric in LOWER_IS_BETTER else "min"
                value = stats.get(side)
                if value is None or math.isnan(value):
                    continue
                current = worst.get(metric)
                if current is None or (value > current if side == "max" else value < current):
                    worst[metric] = value
    return worst


# -- sections -----------------------------------------------------------------------------

def _summary(report: Report) -> str:
    cards = [("recipe", report.recipe), ("variant", report.variant),
             ("artifact", report.artifact.path if report.artifact else None), ("size", human_bytes(_artifact_size(report))),
             ("weights", _weights_ratio(report, long=True))]
    html = ['<div class="cards">', f'<div class="card"><div class="k">result</div><div class="v">{_verdict_badge(report)}</div></div>']
    for key, value in cards:
        if value not in (None, "", "—"):
            html.append(f'<div class="card"><div class="k">{key}</div><div class="v">{escape(str(value))}</div></div>')
    html.append("</div>")
    rows = []
    if report.recipe_path:
        rows.append(["recipe file", f"<code>{escape(report.recipe_path)}</code>"])
    if report.source:
        digest = f" <span class=muted>sha256</span> <code>{escape(report.source.sha256)}</code>" if report.source.sha256 else ""
        rows.append(["source", f"<code>{escape(report.source.model)}</code>{digest}"])
    if report.target:
        parts = (report.target.backend, report.target.deployment_target)
        rows.append(["target", escape(" · ".join(p for p in parts if p))])
        if report.target.precision:
            rows.append(["precision", escape(report.target.precision)])
    if report.compute and report.compute.policy:
        chip = f" (planned for {report.compute.chip})" if report.compute.chip else ""
        rows.append(["compute policy", escape(report.compute.policy + chip)])
    versions = dict(report.versions)
    if report.edgebuild_version and "edgebuild" not in versions:
        versions = {"edgebuild": report.edgebuild_version, **versions}
    if versions:
        rows.append(["versions", escape(", ".join(f"{name} {version}" for name, version in versions.items()))])
    if report.comparison:
        rows.append(["all variants", f'<a href="{escape(relative_href(report.comparison))}">comparison page</a>'])
    if rows:
        html.append(_table(["", ""], rows, raw=True, header=False))
    return "<h2>Summary</h2>" + "".join(html)


def _stages(report: Report) -> str:
    if not report.stages:
        return ""
    rows = []
    for stage in report.stages:
        rows.append([escape(stage.name), _badge(stage.status, good=("ran", "cached")),
                     f'<span class=num>{stage.seconds:.3f}</span>', f'<code>{escape((stage.key or "")[:16])}</code>'])
    total = sum(stage.seconds for stage in report.stages)
    rows.append(["<b>total</b>", "", f"<b>{total:.3f}</b>", ""])
    return "<h2>Stages</h2>" + _table(["stage", "status", "seconds", "key"], rows, raw=True)


def _compression(report: Report) -> str:
    compression = report.compression
    if compression is None or not compression.weights:
        return ""
    before, after = compression.total_before, compression.total_after
    overall = svg.grouped_bars([(f"all {len(compression.weights)} weights", float(before), float(after))],
                               labels=("before", "after"), unit_format=lambda v: human_bytes(v) or "0")
    ordered = sorted(compression.weights, key=lambda w: -w.bytes_before)
    shown = [(w.name, float(w.bytes_before), float(w.bytes_after)) for w in ordered[:MAX_LAYERS_IN_CHART]]
    rest = ordered[MAX_LAYERS_IN_CHART:]
    if rest:
        shown.append((f"({len(rest)} other weights)", float(sum(w.bytes_before for w in rest)),
                      float(sum(w.bytes_after for w in rest))))
    layers = svg.grouped_bars(shown, labels=("before", "after"), unit_format=lambda v: human_bytes(v) or "0")
    applied = compression.applied or _modes_in_words(compression)
    how = escape(f"{applied}: {compression.compressed} of {len(compression.weights)} weights compressed.")
    return (f'<section id="compression"><h2>Compression</h2><p class=sub>{how} {_sizes_in_words(report)}</p>'
            f"<h3>overall</h3>{overall}<h3>per weight, largest first</h3>{layers}</section>")


MODE_WORDS = {"linear": "linear-quantised weights", "palettize": "palettized weights", "prune": "pruned weights"}


def _modes_in_words(compression: Compression) -> str:
    """What a record without its ``applied`` words did, from its weights' modes."""
    modes = sorted({part for w in compression.weights for part in (w.mode or "none").split("+")} - {"none"})
    return ", ".join(MODE_WORDS.get(mode, mode) for mode in modes) or "no compression"


def _sizes_in_words(report: Report) -> str:
    """The weights' sizes, held against the source model's weights where the import stage counted
    them (an fp16 build halves fp32 weights before any compression: the ratio that matters to
    the app is against the model it started from)."""
    compression = report.compression
    before, after = compression.total_before, compression.total_after
    uncompressed = f"uncompressed ({_precision(report)})" if _precision(report) else "uncompressed"
    against_before = f"{compression.ratio:.2f}× smaller than the {uncompressed} weights" if compression.ratio else ""
    source, dtype = report.source_weights
    if report.ratio_to_source is None:
        return (f"{human_bytes(before)} before, {human_bytes(after)} after: "
                f"<b>{escape(against_before) or 'nothing left'}</b>.")
    of_source = f"the source ({dtype})" if dtype else "the source"
    return (f"{human_bytes(source)} in {escape(of_source)}, {human_bytes(before)} {escape(uncompressed)}, "
            f"{human_bytes(after)} after: <b>{report.ratio_to_source:.2f}× smaller than {escape(of_source)}</b>"
            + (f", {escape(against_before)}." if against_before else "."))


def _precision(report: Report) -> str:
    precision = report.target.precision if report.target else None
    return {"float16": "fp16", "float32": "fp32"}.get(precision or "", precision or "")


def _warnings(report: Report) -> str:
    """Every stage's warnings, kept with its result: the console prints them once, when the stage runs."""
    items = []
    for stage in report.stages:
        record = (report.model_extra or {}).get(stage.name)
        for text in (record.get("warnings") or []) if isinstance(record, Mapping) else []:
            items.append(f"<li><b>{escape(stage.name)}</b>: {escape(str(text))}</li>")
    shown = "".join(items)
    for text in report.validation.warnings if report.validation else ():  # validation.json's own, once
        item = f"<li><b>validate</b>: {escape(str(text))}</li>"
        if item not in shown:
            items.append(item)
    return f'<section id="warnings"><h2>Warnings</h2><ul>{"".join(items)}</ul></section>' if items else ""


def _numerics(validation: Validation | None) -> str:
    if validation is not None and validation.not_validated:
        return f'<h2>Numerics</h2><p class="muted">not validated: {escape(validation.not_validated)}</p>'
    if validation is None or not validation.runtimes:
        return ""
    generative = any(runtime.generation is not None for runtime in validation.runtimes.values())
    unit = "prompts" if generative else "samples"
    intro = ", ".join(x for x in (f"{validation.samples} {unit}" if validation.samples else "",
                                  f"reference: {validation.reference}" if validation.reference else "") if x)
    html = [f"<h2>Numerics</h2><p class=sub>{escape(intro)}</p>" if intro else "<h2>Numerics</h2>"]
    html.append(_shape_sets(validation))
    for name, runtime in validation.runtimes.items():
        html.append(f"<h3>candidate: {escape(name)}</h3>")
        if runtime.skipped:
            html.append(f'<p class="muted">skipped: {escape(runtime.skipped)}</p>')
            continue
        if runtime.failures:
            html.append('<ul class="failures">' + "".join(f"<li>{escape(f.message or f.metric)}</li>" for f in runtime.failures) + "</ul>")
        if runtime.float64_check is not None:
            html.append(_float64_check(runtime.float64_check))
        if runtime.generation is not None:
            html.append(_generation(runtime.generation))
        for output, metrics in runtime.metrics.items():
            html.append(f"<h3>output <code>{escape(output)}</code></h3>")
            html.append('<div class="grid-2">' + _metric_table(runtime, output, metrics))
            hist = runtime.histograms.get(output)
            if hist:
                html.append(svg.histogram(hist.counts, hist.edges, title=f"|error| histogram of {output}"))
            html.append("</div>")
    return "".join(html)


def _shape_sets(validation: Validation) -> str:
    """The shapes a model with flexible inputs was validated at, with the lowest cosine at each."""
    if not validation.shapes:
        return ""
    runtimes = sorted({r for entry in validation.shapes for r in entry.cosine_min})
    head = "<tr><th>input shapes</th><th>samples</th>" + "".join(
        f"<th>1 − cosine, worst ({escape(r)})</th>" for r in runtimes) + "</tr>"
    rows = []
    for entry in validation.shapes:
        shapes = ", ".join(f"{name} {list(shape)}" for name, shape in entry.inputs.items())
        worst = [min(entry.cosine_min.get(r, {}).values(), default=None) for r in runtimes]
        rows.append(f"<tr><td><code>{escape(shapes)}</code></td><td>{entry.samples}</td>"
                    + "".join(f"<td>{'' if w is None else _one_minus(w)}</td>" for w in worst) + "</tr>")
    return f"<h3>shapes validated</h3><table>{head}{''.join(rows)}</table>"


def _generation(generation) -> str:
    """Greedy generation, artifact against source: a row per prompt and the per-step logits cosine."""
    rows = []
    for i, p in enumerate(generation.prompts):
        prompt = p.text if p.text is not None else " ".join(map(str, p.prompt))
        divergence = "none" if p.first_divergence is None else str(p.first_divergence)
        verdict = "ok" if p.first_divergence is None else "bad"
        worst = min(p.step_cosine, default=None, key=lambda c: c if c == c else -math.inf)
        rows.append(f"<tr><td>{i}</td><td><code>{escape(_clip_text(prompt))}</code></td>"
                    f"<td class=num>{p.agreement:.1%}</td><td class=\"num {verdict}\">{divergence}</td>"
                    f"<td class=num>{_one_minus(worst)}</td>"
                    f"<td><code>{escape(_tokens(p.artifact_tokens))}</code></td>"
                    f"<td><code>{escape(_tokens(p.source_tokens))}</code></td></tr>")
    head = "".join(f"<th>{h}</th>" for h in ("#", "prompt", "token agreement", "first divergence",
                                              "1 − cosine, worst step", "artifact tokens", "source tokens"))
    chart = svg.step_gaps([(f"prompt {i}", p.step_cosine, p.first_divergence) for i, p in enumerate(generation.prompts)],
                          steps=generation.new_tokens)
    divergence = ("no divergence" if generation.first_divergence is None
                  else f"first divergence at step {generation.first_divergence}")
    intro = (f"Both sides continue each prompt by {generation.new_tokens} greedy tokens; {len(generation.prompts)} "
             f"prompt(s), mean token agreement {generation.mean_agreement:.1%}, worst step 1 − cosine "
             f"{_one_minus(generation.worst_step_cosine)}, {divergence}. Logits are compared up to and including "
             "a prompt's first divergent token (after it, the two contexts differ).")
    return (f'<section class="generation"><h3>generation</h3><p class=sub>{escape(intro)}</p>'
            f"<table><tr>{head}</tr>{''.join(rows)}</table>{chart}</section>")


def _clip_text(text: str, length: int = 60) -> str:
    return text if len(text) <= length else text[:length - 1] + "…"


def _tokens(tokens: list[int], shown: int = 16) -> str:
    text = " ".join(map(str, tokens[:shown]))
    return text + (f" … (+{len(tokens) - shown})" if len(tokens) > shown else "")


def _float64_check(check) -> str:
    """Both distances from the exact answer, so a reader sees which side is noisy."""
    if check.skipped:
        return f'<p class="muted">float64 check: {escape(check.skipped)}</p>'
    head = "".join(f"<th>{h}</th>" for h in ("output", "artifact 1 − cosine", "artifact max abs",
                                              "onnxruntime fp32 1 − cosine", "onnxruntime fp32 max abs", "ratio"))
    rows = "".join(
        f"<tr><td><code>{escape(output)}</code></td><td class=num>{_one_minus(d.candidate.cosine)}</td>"
        f"<td class=num>{_num(d.candidate.max_abs)}</td><td class=num>{_one_minus(d.fp32_reference.cosine)}</td>"
        f"<td class=num>{_num(d.fp32_reference.max_abs)}</td><td class=num>{_num(d.noise_ratio)}</td></tr>"
        for output, d in check.outputs.items())
    intro = (f"Against the source evaluated in float64 ({escape(check.evaluator or '')}), on sample "
             f"{check.sample}, the worst one:")
    return f"<p class=sub>{intro}</p><table><tr>{head}</tr>{rows}</table>"


def _metric_table(runtime: RuntimeRecord, output: str, metrics: Mapping[str, Mapping[str, float]]) -> str:
    """One row per metric: mean and worst sample, the limit, the statistic it is held against and
    its value, pass or FAIL. Cosine shows as 1 − cosine, so 0.99999 and 0.9999 look different."""
    limits = {}
    for threshold, limit in runtime.limits.get(output, {}).items():
        metric, side = metric_of(threshold)
        limits[metric] = (side, limit)
    failed = {f.metric for f in runtime.failures if f.output == output}
    for failure in runtime.failures:  # a limit recorded only in its failure
        if failure.output == output and failure.metric not in limits and None not in (failure.value, failure.limit):
            limits[failure.metric] = ("min" if failure.value < failure.limit else "max", failure.limit)
    statistics = runtime.aggregation.get(output, {})
    rows = []
    for metric, stats in metrics.items():
        worst_side = "max" if metric in LOWER_IS_BETTER else "min"
        side, limit = limits.get(metric, (worst_side, None))
        statistic = statistics.get(metric) or next((f.statistic for f in runtime.failures
                                                    if f.output == output and f.metric == metric), "worst")
        show = _one_minus if metric in COSINES else _num
        label = LABELS.get(metric, "1 − cosine" if metric == "cosine" else metric)
        if metric == "nonfinite":
            limit_text, held, value, verdict = "= 0", "worst", stats.get("max"), "bad" if metric in failed else "ok"
        elif limit is None:
            limit_text, held, value, verdict = "—", "", None, ""
        else:
            bound = ("≤ " + _one_minus(limit)) if metric in ("cosine", "step_cosine") else f"{'≥' if side == 'min' else '≤'} {_num(limit)}"
            limit_text, held, verdict = bound, statistic, "bad" if metric in failed else "ok"
            value = stats.get(statistic_key(statistic, side))
        result = {"ok": "pass", "bad": "FAIL"}.get(verdict, "")
        rows.append(
            f"<tr><td>{escape(label)}</td><td class=num>{show(stats.get('avg'))}</td>"
            f"<td class=num>{show(stats.get(worst_side))}</td><td class=num>{escape(limit_text)}</td>"
            f"<td>{escape(held)}</td><td class=\"num {verdict}\">{show(value) if value is not None else ''}</td>"
            f"<td class=\"{verdict}\">{result}</td></tr>")
    head = "".join(f"<th>{h}</th>" for h in ("metric", "mean", "worst sample", "limit", "held against", "value", "result"))
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _plan(plan) -> str:
    if plan is None:
        return ""
    from edgebuild.report.compute_plan import PER_SHAPE_HEADERS, op_groups, per_shape_cells, unit_shares

    html = ["<h2>Compute plan</h2>"]
    if plan.total_ms is not None:
        html.append(f"<p class=sub>{len(plan.ops)} ops, estimated total {_num(plan.total_ms)} ms"
                    f"{escape(' (' + str(plan.model_extra.get('note')) + ')') if plan.model_extra.get('note') else ''}</p>")
    if plan.ops:
        rows = [[s.unit, str(s.ops), f"{s.op_share:.1f}%", _num(s.ms), f"{s.time_share:.1f}%"] for s in unit_shares(plan.ops)]
        html.append("<h3>by unit</h3>" + _table(["unit", "ops", "share of ops", "est ms", "share of time"], rows))
        if plan.model_extra.get("per_shape"):
            html.append("<h3>per enumerated shape</h3>"
                        + _table(list(PER_SHAPE_HEADERS), per_shape_cells(plan.model_extra["per_shape"])))
        groups = op_groups(plan.ops)
        rows = [[*(["; ".join(g.reasons) or "—", "; ".join(g.fixes)] if i == 0 or groups[i - 1].reasons != g.reasons
                   else ["", ""]), g.unit, g.op, str(g.count), _num(g.ms)]
                for i, g in enumerate(groups[:MAX_PLAN_ROWS])]
        html.append("<h3>by reason and op type</h3>"
                    + _table(["why not a faster unit / note", "fix", "unit", "op", "ops", "est ms"], rows))
        if len(groups) > MAX_PLAN_ROWS:
            html.append(f'<p class="muted">{len(groups) - MAX_PLAN_ROWS} more groups in report.json</p>')
    elif plan.breakdown:
        html.append("<h3>breakdown</h3>" + _mapping_table(plan.breakdown, key_header="unit"))
    return "".join(html)


def _optimize_level(optimize) -> str:
    """The optimize stage's level (``optimize.level``), which decides the passes listed below it."""
    level = optimize.get("level") if isinstance(optimize, Mapping) else None
    if not level:
        return ""
    return (f'<h2>Optimisation</h2><p class="sub">optimize.level <b>{escape(str(level))}</b>: '
            "the passes and onnxscript rules this level runs, with the recipe's optimize.passes switches</p>")


def _fusion_rules(optimize) -> str:
    rules = (optimize or {}).get("rules") if isinstance(optimize, Mapping) else None
    if not rules:
        return ""
    if isinstance(rules, Mapping):
        # what fired is the news; the rules that found nothing to fuse are folded away
        idle = [str(name) for name, count in rules.items() if isinstance(count, (int, float)) and count <= 0]
        rows = [[str(name), _short(count)] for name, count in rules.items() if str(name) not in idle]
        html = "<h2>Fusion rules fired</h2>" + (_table(["rule", "times"], rows) if rows else
                                                 '<p class="sub">No fusion rule matched this model.</p>')
        if idle:
            html += (f"<details><summary>{len(idle)} rule{'s' if len(idle) > 1 else ''} did not match</summary>"
                     f'<p class="muted">{escape(", ".join(idle))}</p></details>')
        return html
    if all(isinstance(rule, Mapping) for rule in rules):
        columns = _columns(rules)
        return "<h2>Fusion rules fired</h2>" + _table(columns, [[_short(r.get(c)) for c in columns] for r in rules])
    return "<h2>Fusion rules fired</h2><ul>" + "".join(f"<li>{escape(str(r))}</li>" for r in rules) + "</ul>"


def _renamings(renamings) -> str:
    """Every tensor the artifact names differently from the source model (callers of edgebuild's
    APIs keep the source names; an app calling Core ML directly sees the artifact's)."""
    if not renamings:
        return ""
    rows = [[r.tensor, "" if r.segment is None else str(r.segment), r.onnx, r.artifact, r.reason or ""]
            for r in renamings]
    return ("<h2>Renamed inputs and outputs</h2><p>The artifact names these tensors differently from the "
            "source model; InferenceSession, verify and bundles take and return the source names.</p>"
            + _table(["tensor", "segment", "source (ONNX) name", "artifact name", "why"], rows))


def _quantization(optimize: OptimizeRecord | None) -> str:
    quantization = optimize.quantization if optimize is not None else None
    if quantization is None or not quantization.applies:
        return ""
    rows = [["activations", "float (weight-only)" if quantization.activations == "float" else "quantised, as in the source"],
            ["quantised weights kept", str(quantization.weights_quantized)],
            ["activation quantise/dequantise pairs removed", str(quantization.activation_pairs_removed)]]
    return (f'<section id="quantization"><h2>Quantised source</h2><p class=sub>{escape(quantization.summary)}</p>'
            + _table(["", ""], rows, header=False) + "</section>")


def _notes(notes) -> str:
    if not notes:
        return ""
    return "<h2>Notes</h2><ul>" + "".join(f"<li>{escape(str(n))}</li>" for n in notes) + "</ul>"


# -- helpers ------------------------------------------------------------------------------

GENERATOR_META = '<meta name="generator" content="edgebuild">'  # marks pages edgebuild may replace


def _page(title: str, body: str) -> str:
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">{GENERATOR_META}<title>{escape(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head>'
            f"<body>{body}</body></html>\n")


def _artifact_size(report: Report):
    return report.artifact.size_bytes if report.artifact else None


def _weights_ratio(report: Report, *, long: bool = False) -> str:
    """``3.96× smaller than the source`` (``long``) or ``3.96× vs source``; against the weights
    before compression where the source's were not counted; ``no compression``."""
    compression = report.compression
    if compression is None or not compression.weights:
        return "no compression"
    if report.ratio_to_source is not None:
        return f"{report.ratio_to_source:.2f}× " + ("smaller than the source" if long else "vs source")
    if compression.ratio:
        return f"{compression.ratio:.2f}× " + ("smaller than before compression" if long else "vs uncompressed")
    return "—"


def _verdict_badge(report: Report) -> str:
    """The variant's headline: validation passed (green), failed (red), or built, not validated (grey)."""
    verdict = report.verdict
    cls = "ok" if verdict == PASSED else "bad" if verdict == FAILED else "neutral"
    return f'<span class="badge {cls}">{escape(verdict)}</span>'


def failure_words(failure: Failure, runtime: str | None = None) -> str:
    """``logits: 1 − cosine 1.2e-03 (limit 1.000e-03), interpreter``: the limit a variant missed,
    by output and metric."""
    if not failure.metric:
        return failure.message or "a limit was missed"
    if failure.metric in COSINES and isinstance(failure.value, (int, float)):
        value, limit = _one_minus(failure.value), _one_minus(failure.limit)
        metric = f"1 − {failure.metric}"
    else:
        value, limit, metric = _num(failure.value), _num(failure.limit), failure.metric
    where = [f"prompt {failure.prompt}"] if failure.prompt is not None else []
    if failure.step is not None:
        where.append(f"step {failure.step}")
    if runtime or failure.runtime:
        where.append(runtime or failure.runtime)
    text = f"{failure.output}: {metric} {value} (limit {limit})" if failure.output else f"{metric} {value} (limit {limit})"
    return text + (f", {', '.join(where)}" if where else "")


MAX_FAILURES_SHOWN = 3


def _failures_cell(report: Report) -> str:
    """Which limits a variant missed, each by output and metric; ``none`` when it passed."""
    missed = [failure_words(f, name) for name, runtime in (report.validation.runtimes.items() if report.validation else ())
              for f in runtime.failures]
    if not missed:
        return "none" if report.verdict == PASSED else "—"
    shown = "".join(f"<li>{escape(text)}</li>" for text in missed[:MAX_FAILURES_SHOWN])
    more = f"<li>and {len(missed) - MAX_FAILURES_SHOWN} more</li>" if len(missed) > MAX_FAILURES_SHOWN else ""
    return f'<ul class="failures">{shown}{more}</ul>'


def _badge(status, good=("built", "ran", "cached")) -> str:
    text = str(status or "unknown")
    lowered = text.lower()
    cls = "ok" if lowered in good else "bad" if lowered in ("failed", "error", "fail") else "neutral"
    return f'<span class="badge {cls}">{escape(text)}</span>'


def human_bytes(size) -> str:
    """``12.35 MB``: sizes in SI units, as Finder shows them."""
    if not isinstance(size, (int, float)):
        return "—"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(size) < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1000
    return ""


def _one_minus(cosine) -> str:
    """1 − cosine in scientific notation: the distance from identical that a limit like 0.9999 is about."""
    if not isinstance(cosine, (int, float)) or math.isnan(cosine):
        return _num(cosine)
    gap = 1.0 - cosine
    return "0" if gap == 0 else f"{gap:.3e}"


def _num(value, digits: int = 6) -> str:
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
