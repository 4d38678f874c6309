"""Hold aggregated metrics to the recipe's limits.

A limit named ``<metric>_min`` is compared with the lowest value any sample reached, and
``<metric>_max`` with the highest: a threshold is only met when every sample meets it.
NaN/inf in a candidate output is always a failure, thresholds or not.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional

from edgebuild.verify.config import Thresholds

NONFINITE = "nonfinite"


@dataclass(frozen=True)
class Failure:
    """One unmet limit (``limit`` is None for failures that are not a threshold, like NaN output)."""

    output: str
    metric: str
    value: Optional[float]
    limit: Optional[float]
    message: str

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
        nonfinite = metrics.get(NONFINITE, {}).get("max", 0.0)
        if nonfinite:
            failures.append(Failure(output, NONFINITE, nonfinite, None, f"output '{output}': candidate has NaN/inf ({int(nonfinite)} values in the worst sample)"))
        override = overrides.get(output)
        limits = base.merged(override)
        explicit = set(override.model_dump(exclude_unset=True)) if override else set()
        for name, limit in limits.model_dump(exclude_none=True).items():
            failure = _check_one(output, metrics, name, limit, required=name in explicit)
            if failure:
                failures.append(failure)
    return failures


def limits_for(thresholds: Thresholds | Mapping[str, Any] | None, per_output: Mapping[str, Any] | None, output: str) -> dict[str, float]:
    """The limits that apply to ``output``, as ``{threshold name: limit}`` (for reports)."""
    override = (per_output or {}).get(output)
    merged = _as_thresholds(thresholds).merged(_override_thresholds(override) if override is not None else None)
    return merged.model_dump(exclude_none=True)


def metric_of(threshold: str) -> tuple[str, str]:
    """``"cosine_min"`` -> ``("cosine", "min")``."""
    metric, _, side = threshold.rpartition("_")
    return metric, side


def _check_one(output: str, metrics, threshold: str, limit: float, *, required: bool) -> Failure | None:
    metric, side = metric_of(threshold)
    if metric not in metrics:
        if not required:  # e.g. a global top1 limit on an output that is not a classifier
            return None
        return Failure(output, metric, None, limit, f"output '{output}': {metric} is not available for this output, but per_output sets {threshold}")
    worst = metrics[metric]["min" if side == "min" else "max"]
    if math.isnan(worst):
        return Failure(output, metric, worst, limit, f"output '{output}': {metric} is NaN ({threshold} {_fmt(limit)})")
    if side == "min" and worst < limit:
        return Failure(output, metric, worst, limit, f"output '{output}': {metric} {_fmt(worst)} < {threshold} {_fmt(limit)}")
    if side == "max" and worst > limit:
        return Failure(output, metric, worst, limit, f"output '{output}': {metric} {_fmt(worst)} > {threshold} {_fmt(limit)}")
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
