"""When a limit fails against onnxruntime's fp32 result: is the conversion noisy, or the reference?

Cosine and relative error are ill-conditioned on outputs that are almost zero (a detector's
probability map on random inputs, LayerNorm outputs from cancellation): there two correct fp32
evaluations disagree. So on a failure the sample that failed worst is evaluated once more, in
float64, and both distances from that exact answer are reported beside the failure.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping, Sequence

import numpy as np

from edgebuild.verify.float64 import ONNX_REFERENCES, float64_reference
from edgebuild.verify.metrics import compare_output, distances_from_float64
from edgebuild.verify.thresholds import Failure

# Failures of these metrics are about numeric distance, which float64 can arbitrate.
# At most this many times the reference's distance, the artifact is "as close as onnxruntime is".
NOISY_REFERENCE_RATIO = 2.0

DISTANCE_METRICS = {"cosine": "min", "snr_db": "min", "max_abs": "max", "mean_abs": "max", "p99_abs": "max",
                    "max_rel": "max"}


def float64_check(source_path, reference_name: str, failures: Sequence[Failure], per_sample: Sequence[Mapping],
                  samples: Sequence[Mapping], fixed: Mapping, reference: Callable, candidate: Callable) -> dict | None:
    """``{"sample", "evaluator", "outputs": {output: {"candidate": {...}, "fp32_reference": {...},
    "noise_ratio"}}}`` for the outputs that failed a distance limit, measured on the worst such
    sample; ``{"skipped": why}`` when the source cannot be evaluated in float64; None when no
    distance limit failed."""
    failed = [f for f in failures if f.metric in DISTANCE_METRICS and f.output]
    own = getattr(reference, "float64", None)  # a frontend's runner evaluating its source in float64
    if not failed or (own is None and reference_name not in ONNX_REFERENCES):
        return None
    index = worst_sample(failed[0], per_sample)
    try:
        truth, evaluator = own() if own is not None else float64_reference(source_path)
        feed = {**samples[index], **fixed}
        exact, ref, cand = truth(feed), reference(feed), candidate(samples[index])
    except Exception as exc:  # diagnostics must not turn a validation failure into a crash
        return {"skipped": f"no float64 evaluation of the source: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}
    outputs = {}
    for output in dict.fromkeys(f.output for f in failed):
        if output not in exact or np.asarray(exact[output]).dtype.kind != "f":
            continue
        if np.size(cand[output]) != np.size(exact[output]):  # detections: rows matched by IoU, not by place
            continue
        ours = compare_output(output, exact[output], np.asarray(cand[output]).reshape(np.shape(exact[output])))
        theirs = distances_from_float64(output, exact[output], ref[output], ours["max_abs"])
        outputs[output] = {
            "candidate": {"cosine": ours["cosine"], "max_abs": ours["max_abs"]},
            "fp32_reference": {"cosine": theirs["fp32_reference_cosine"], "max_abs": theirs["fp32_reference_max_abs"]},
            "noise_ratio": theirs["noise_ratio"],
        }
    return {"sample": index, "evaluator": evaluator, "outputs": outputs}


def worst_sample(failure: Failure, per_sample: Sequence[Mapping]) -> int:
    """The index of the sample with the worst value of the failed metric on the failed output."""
    side = DISTANCE_METRICS[failure.metric]
    values = [sample.get(failure.output, {}).get(failure.metric, math.nan) for sample in per_sample]
    values = [v if not math.isnan(v) else (math.inf if side == "min" else -math.inf) for v in values]
    return int(np.argmin(values) if side == "min" else np.argmax(values))


def explain_failures(failures: Sequence[Failure], check: Mapping) -> list[Failure]:
    """``failures`` with the float64 distances appended to the message of each failed output."""
    outputs = check.get("outputs", {})
    explained = []
    for failure in failures:
        found = outputs.get(failure.output) if failure.metric in DISTANCE_METRICS else None
        if found is None:
            explained.append(failure)
            continue
        ours, theirs = found["candidate"], found["fp32_reference"]
        verdict = ("the conversion is no further from the exact answer than onnxruntime is: the fp32 reference "
                   "is the noisy side; hold it to validate.reference: float64 with noise_ratio_max"
                   if found["noise_ratio"] <= NOISY_REFERENCE_RATIO else
                   "the artifact is further from the exact answer than onnxruntime is")
        note = (f" — against a float64 evaluation (sample {check['sample']}): artifact 1−cos "
                f"{1 - ours['cosine']:.2g}, max abs {ours['max_abs']:.2g}; onnxruntime fp32 1−cos "
                f"{1 - theirs['cosine']:.2g}, max abs {theirs['max_abs']:.2g} (ratio {found['noise_ratio']:.2g}): {verdict}")
        explained.append(dataclasses.replace(failure, message=failure.message + note))
    return explained
