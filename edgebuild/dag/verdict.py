"""The verdict on the validate stage's measurements: the recipe's limits, held to what was measured.

The validate stage measures (per runtime: the aggregated metrics, the error histograms, the sample
each distance metric was worst on; for generation, each prompt's comparison) and its key leaves out
``validate.thresholds`` and ``validate.per_output``, which only judge. :func:`judge` turns that
record into the report's ``validation`` record (limits, failures, the float64 check of a failed
distance limit) for every variant that reads it, cached or not: a threshold edit re-judges, it does
not re-run a runtime. No numpy here: a cached run that passes imports nothing numeric.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from edgebuild.report.write import runtime_record
from edgebuild.verify.thresholds import aggregation_for, check, limits_for

# ``diagnose(runtime, failures, per_sample) -> float64 check record | None``: a failed distance limit
# measured once more against float64 (edgebuild.verify.diagnose.float64_check)
Diagnose = Callable[[str, Sequence, Sequence[Mapping]], "dict | None"]


def judge(measured: Mapping, section, *, diagnose: Diagnose | None = None) -> dict:
    """The ``validation`` record of ``measured`` (the validate stage's, or ``measure_*``'s) under the
    recipe's validate ``section``; its keys in the order the record always had, ``failures`` after
    ``runtimes``. ``diagnose``: see :data:`Diagnose` (None: no float64 check). Numbers stay as
    measured (NaN a float): the stage's record is made JSON-safe by its caller."""
    runtimes, failures = {}, []
    for name, one in (measured.get("runtimes") or {}).items():
        if "comparison" in one:
            runtimes[name], missed = _judged_generation(one["comparison"], section)
        elif "metrics" in one:
            runtimes[name], missed = _judged_outputs(name, one, section, measured, diagnose)
        else:  # skipped: nothing was measured to judge
            runtimes[name], missed = dict(one), []
        failures += [{"runtime": name, **f} for f in missed]
    record: dict = {}
    for key, value in measured.items():
        if key == "failures":
            continue
        record[key] = runtimes if key == "runtimes" else value
        if key == "runtimes":
            record["failures"] = failures
    return record


def _judged_outputs(runtime: str, measured: Mapping, section, record: Mapping,
                    diagnose: Diagnose | None) -> tuple[dict, list[dict]]:
    aggregated = measured["metrics"]
    failures = check(aggregated, section.thresholds, section.per_output)
    limits = {o: limits_for(section.thresholds, section.per_output, o) for o in aggregated}
    statistics = {o: aggregation_for(section.thresholds, section.per_output, o) for o in aggregated}
    judged = runtime_record(aggregated, failures, limits=limits, aggregation=statistics,
                            histograms=measured.get("histograms"))
    if section.reference != "float64" and failures and diagnose is not None:
        # Is the conversion or the fp32 reference noisy? Both against float64 on the worst sample.
        checked = diagnose(runtime, failures, worst_only(measured.get("worst_samples") or {}, record["samples"]))
        if checked is not None:
            from edgebuild.verify.diagnose import explain_failures

            judged["float64_check"] = checked
            failures = explain_failures(failures, checked)
            judged["failures"] = runtime_record({}, failures)["failures"]
    return judged, [f.to_dict() for f in failures]


def worst_only(worst_samples: Mapping, samples: int) -> list[dict]:
    """Per-sample metrics holding, for each output and distance metric, only its worst value, at the
    sample it was reached on (``worst_samples``: ``{output: {metric: [sample, value]}}``): what the
    float64 check reads to pick its sample, without keeping every sample's metrics."""
    per_sample: list[dict] = [{} for _ in range(samples)]
    for output, metrics in worst_samples.items():
        for metric, (index, value) in metrics.items():
            per_sample[index].setdefault(output, {})[metric] = float(value)
    return per_sample


def _judged_generation(comparison: Mapping, section) -> tuple[dict, list[dict]]:
    from edgebuild.verify.generation import (
        GenerationComparison,
        PromptComparison,
        check_generation,
        generation_limits,
        generation_record,
    )

    prompts = [PromptComparison(**{**p, "step_cosine": [float(c) for c in p["step_cosine"]]})
               for p in comparison["prompts"]]
    compared = GenerationComparison(comparison["new_tokens"], prompts)
    limits = generation_limits(section.thresholds)
    failures = check_generation(compared, limits)
    return generation_record(compared, limits, failures), failures
