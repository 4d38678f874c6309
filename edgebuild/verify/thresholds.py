"""Hold aggregated metrics to the recipe's limits.

A limit named ``<metric>_min`` (``_max``) is compared with one statistic of the metric over
the samples, ``thresholds.aggregate[metric]``:

- ``worst`` (the default): the lowest (highest) value any sample reached, so the limit holds
  for every sample. The default for every error metric: cosine, max_abs, mean_abs, p99_abs,
  max_rel, snr_db.
- ``mean`` (the default for top1_agreement and top5_agreement, which are rates): the average
  over the samples. A batch-1 classifier's top-1 agreement is 0 or 1 per sample; its mean
  is the agreement rate.
- ``median``, ``p1``, ``p10``, ``p90``, ``p99``: that percentile over the samples (linear
  interpolation, as numpy's); ``cosine: p10`` lets one sample in ten fall below the limit.

NaN/inf fail on their own, thresholds or not (``metrics`` says what is counted): NaN or inf in
the candidate where the reference is finite; NaN in the reference anywhere, or an infinity the
candidate does not share (a NaN reference proves nothing, even matched by a NaN candidate); and
an output with no element finite on both sides in some sample (nothing was compared there, so
its other limits are not held: every metric of it is NaN). The same infinity on both sides at
one position (a masked logit) agrees; the finite rest is held to the limits.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional

from edgebuild.recipe.validation import Thresholds, aggregation_of

NONFINITE = "nonfinite"
REFERENCE_NONFINITE = "reference_nonfinite"
COMPARED = "compared"


@dataclass(frozen=True)
class Failure:
    """One unmet limit (``limit`` is None for failures that are not a threshold, like NaN output)."""

    output: str
    metric: str
    value: Optional[float]
    limit: Optional[float]
    message: str
    statistic: str = "worst"  # which statistic over the samples ``value`` is (thresholds.aggregate)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check(
    aggregated: Mapping[str, Mapping[str, Mapping[str, float]]],
    thresholds: Thresholds | Mapping[str, Any] | None,
    per_output: Mapping[str, Any] | None = None,
) -> list[Failure]:
    """Failures of ``aggregated`` (from ``metrics.aggregate``) against the global ``thresholds``
    and the ``per_output`` overrides (``{output: {"thresholds": {...}}}`` or ``OutputOverride``s).
    """
    base = _as_thresholds(thresholds)
    overrides = {name: _override_thresholds(value) for name, value in (per_output or {}).items()}
    failures: list[Failure] = []
    for output in overrides:
        if output not in aggregated:
            failures.append(Failure(output, "output", None, None, f"per_output names output '{output}', which the model does not have (outputs: {', '.join(aggregated)})"))
    for output, metrics in aggregated.items():
        failures += _nonfinite_failures(output, metrics)
        if metrics.get(COMPARED, {}).get("min", 1.0) == 0:  # its metrics are NaN: the failure above says why
            continue
        override = overrides.get(output)
        limits = base.merged(override)
        explicit = set(override.model_dump(exclude_unset=True)) if override else set()
        for name, limit in _limits(limits).items():
            statistic = aggregation_of(limits.aggregate, metric_of(name)[0])
            failure = _check_one(output, metrics, name, limit, statistic, required=name in explicit)
            if failure:
                failures.append(failure)
    return failures


def _nonfinite_failures(output: str, metrics) -> list[Failure]:
    """NaN/inf failures of one output (see the module docstring), each naming the side that has them."""
    failures = []
    candidate = metrics.get(NONFINITE, {}).get("max", 0.0)
    if candidate:
        failures.append(Failure(output, NONFINITE, candidate, None,
                                f"output '{output}': candidate has NaN/inf ({int(candidate)} values in the worst sample) "
                                "where the reference is finite"))
    reference = metrics.get(REFERENCE_NONFINITE, {}).get("max", 0.0)
    if reference:
        failures.append(Failure(output, REFERENCE_NONFINITE, reference, None,
                                f"output '{output}': reference has NaN/inf ({int(reference)} values in the worst sample) "
                                "that the candidate does not share, or NaN: validation inputs the source model "
                                "cannot compute prove nothing (check validate.inputs)"))
    compared = metrics.get(COMPARED, {})
    if compared.get("min", 1.0) == 0:
        failures.append(Failure(output, COMPARED, 0.0, None,
                                f"output '{output}': no value is finite in both reference and candidate in at least one "
                                "sample (all NaN/inf), so nothing was compared there"))
    return failures


def limits_for(thresholds: Thresholds | Mapping[str, Any] | None, per_output: Mapping[str, Any] | None, output: str) -> dict[str, float]:
    """The limits that apply to ``output``, as ``{threshold name: limit}`` (for reports)."""
    return _limits(_merged(thresholds, per_output, output))


def aggregation_for(thresholds: Thresholds | Mapping[str, Any] | None, per_output: Mapping[str, Any] | None,
                    output: str) -> dict[str, str]:
    """``{metric: statistic}`` for every metric with a limit on ``output`` (for reports)."""
    merged = _merged(thresholds, per_output, output)
    return {metric_of(name)[0]: aggregation_of(merged.aggregate, metric_of(name)[0]) for name in _limits(merged)}


def statistic_key(statistic: str, side: str) -> str:
    """The key of ``metrics.aggregate``'s statistics that ``statistic`` reads for a ``side`` limit."""
    if statistic == "worst":
        return "min" if side == "min" else "max"
    return {"mean": "avg", "median": "p50"}.get(statistic, statistic)


def _merged(thresholds, per_output, output: str) -> Thresholds:
    override = (per_output or {}).get(output)
    return _as_thresholds(thresholds).merged(_override_thresholds(override) if override is not None else None)


def _limits(thresholds: Thresholds) -> dict[str, float]:
    return thresholds.model_dump(exclude_none=True, exclude={"aggregate"})


def metric_of(threshold: str) -> tuple[str, str]:
    """``"cosine_min"`` -> ``("cosine", "min")``."""
    metric, _, side = threshold.rpartition("_")
    return metric, side


def _check_one(output: str, metrics, threshold: str, limit: float, statistic: str, *, required: bool) -> Failure | None:
    metric, side = metric_of(threshold)
    if metric not in metrics:
        if not required:  # e.g. a global top1 limit on an output that is not a classifier
            return None
        return Failure(output, metric, None, limit, f"output '{output}': {metric} is not available for this output, but per_output sets {threshold}", statistic)
    value = float(metrics[metric][statistic_key(statistic, side)])
    over = "" if statistic == "worst" else f" ({statistic} over the samples)"
    if math.isnan(value):
        return Failure(output, metric, value, limit, f"output '{output}': {metric} is NaN ({threshold} {_fmt(limit)})", statistic)
    if (side == "min" and value < limit) or (side == "max" and value > limit):
        shown, bound = _fmt_apart(value, limit)
        sign = "<" if side == "min" else ">"
        return Failure(output, metric, value, limit, f"output '{output}': {metric}{over} {shown} {sign} {threshold} {bound}", statistic)
    return None


def _as_thresholds(value) -> Thresholds:
    if value is None:
        return Thresholds()
    return value if isinstance(value, Thresholds) else Thresholds.model_validate(value)


def _override_thresholds(value) -> Thresholds:
    if hasattr(value, "thresholds"):
        return value.thresholds
    return Thresholds.model_validate(dict(value).get("thresholds", {}))


def _fmt(value: float) -> str:
    return f"{value:.6g}"


def _fmt_apart(value: float, limit: float) -> tuple[str, str]:
    """Both numbers with just enough digits to tell them apart (0.9999899 vs 0.99999)."""
    for digits in range(6, 17):
        shown, bound = f"{value:.{digits}g}", f"{limit:.{digits}g}"
        if shown != bound:
            return shown, bound
    return shown, bound
