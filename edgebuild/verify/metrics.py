"""How far a candidate's outputs are from the reference's, per output and per sample.

Definitions (``r`` reference, ``c`` candidate, ``d = c - r``, all in float64):

- ``max_abs``, ``mean_abs``, ``p90_abs``, ``p99_abs``: max / mean / percentiles (linear
  interpolation) of ``|d|``.
- ``max_rel``: ``max(|d| / max(|r|, rel_floor))``. The floor (default ``REL_FLOOR = 1e-3``)
  stops elements near zero from turning tiny absolute errors into huge relative ones.
- ``cosine``: ``r.c / (|r| |c|)`` over the flattened output; 1.0 when both are all zeros,
  0.0 when only one is.
- ``snr_db``: ``10 log10(sum r^2 / sum d^2)``; ``inf`` when the outputs are identical.
- ``top1_agreement``, ``top5_agreement`` (floating outputs whose last dimension is at least
  2 / 5, read as scores over classes): per row of the last dimension, the share of the
  reference's top-k classes that are also in the candidate's top-k, averaged over rows.
  For k=1 this is "same argmax".
- with a float64 reference (``validate.reference: float64``) the metrics above measure the
  candidate against the source evaluated in float64, and each floating output also gets
  ``fp32_reference_cosine`` and ``fp32_reference_max_abs`` (onnxruntime fp32 against the same
  float64 answer) and ``noise_ratio``: the candidate's ``max_abs`` over the fp32 reference's,
  the latter floored at ``NOISE_FLOOR_EPS`` float32 epsilons of the output's largest magnitude
  (last-bit differences are not noise, and an exact reference does not divide by zero). 2.0 reads "twice as far from the exact answer as
  onnxruntime is".
- NaN and inf (see ``thresholds.check`` for what fails): the same infinity on both sides at one
  position (a masked logit, -inf in reference and candidate) agrees and is left out of the
  metrics above, which are computed over the elements finite on both sides. ``nonfinite``
  counts the candidate's NaN/inf where the reference is finite or another infinity;
  ``reference_nonfinite`` the reference's NaN (anywhere: a NaN reference proves nothing, even
  where the candidate is NaN too) and its infinities the candidate does not share; ``compared``
  the elements finite on both sides (left out for an empty output). When none is (an all-NaN or all-inf output), every metric
  above is NaN: nothing was compared, which is never a cosine of 1.
- detectors' outputs (``validate.detections``) are matched box by box first
  (:mod:`edgebuild.verify.detections`): the metrics above are taken over the matched pairs, and
  the boxes output gets ``box_match``, ``box_recall``, ``box_precision``, ``box_iou`` and
  ``box_score_diff`` besides.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from edgebuild.errors import BuildError

REL_FLOOR = 1e-3
FLOAT32_EPS = float(np.finfo(np.float32).eps)
# The fp32 reference's distance from float64 is floored at this many float32 epsilons of the
# output's magnitude: closer than that, both sides differ in their last bits, and a ratio of
# last-bit errors (1 ulp against 3) says nothing about the conversion.
NOISE_FLOOR_EPS = 4
TOP_K = (1, 5)
STATISTICS = ("avg", "p1", "p10", "p50", "p90", "p99", "max", "min")

# Fixed log-spaced bins for |error| histograms, so per-sample histograms simply add up.
# Bin 0 holds exact zeros (and anything below 1e-9), the last bin everything from 1e3 up.
HISTOGRAM_EDGES = tuple(float(e) for e in 10.0 ** np.arange(-9, 3.5, 0.5))

OutputMetrics = dict[str, float]


def compare(
    reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray], *, rel_floor: float = REL_FLOOR,
    detections: Sequence = (),
) -> dict[str, OutputMetrics]:
    """Metrics for each reference output of one sample (see the module docstring); ``detections``: the
    recipe's ``validate.detections`` groups, whose outputs are matched box by box."""
    from edgebuild.verify.detections import compare_detections, detection_outputs

    matched: dict[str, OutputMetrics] = {}
    for index, group in enumerate(detections):
        matched.update(compare_detections(group, reference, candidate, compare_output, rel_floor=rel_floor,
                                          where=f"validate.detections[{index}]"))
    grouped = detection_outputs(detections)
    return {name: matched[name] if name in grouped else
            compare_output(name, ref, _candidate_output(name, ref, candidate), rel_floor=rel_floor)
            for name, ref in reference.items()}


def compare_output(name: str, reference: np.ndarray, candidate: np.ndarray, *, rel_floor: float = REL_FLOOR) -> OutputMetrics:
    ref = np.asarray(reference)
    cand = np.asarray(candidate)
    ref64 = ref.astype(np.float64).reshape(-1)
    cand64 = cand.astype(np.float64).reshape(-1)
    ref_finite, cand_finite = np.isfinite(ref64), np.isfinite(cand64)
    both_finite = ref_finite & cand_finite
    same_infinity = np.isinf(ref64) & (ref64 == cand64)
    ref_nan = np.isnan(ref64)
    result: OutputMetrics = {
        "nonfinite": float(np.count_nonzero(~cand_finite & ~same_infinity & ~ref_nan)),
        "reference_nonfinite": float(np.count_nonzero(ref_nan | (np.isinf(ref64) & ~same_infinity))),
    }
    if ref64.size:  # an empty output (no detections, say) compares as equal, with nothing to count
        result["compared"] = float(np.count_nonzero(both_finite))
    r, c = ref64[both_finite], cand64[both_finite]
    diff = np.abs(c - r)
    if not diff.size and ref64.size:  # every element NaN/inf: nothing compared, no metric can say "close"
        undefined = ("max_abs", "mean_abs", "p90_abs", "p99_abs", "max_rel", "cosine", "snr_db")
        result.update(dict.fromkeys(undefined, float("nan")))
        if _is_classifier_like(ref):
            result.update((f"top{k}_agreement", float("nan")) for k in TOP_K if ref.shape[-1] >= k)
        return result
    if diff.size:
        result.update(
            max_abs=float(diff.max()),
            mean_abs=float(diff.mean()),
            p90_abs=float(np.percentile(diff, 90)),
            p99_abs=float(np.percentile(diff, 99)),
            max_rel=float((diff / np.maximum(np.abs(r), rel_floor)).max()),
        )
    else:  # an empty output compares as equal
        result.update(max_abs=0.0, mean_abs=0.0, p90_abs=0.0, p99_abs=0.0, max_rel=0.0)
    result["cosine"] = _cosine(r, c)
    result["snr_db"] = _snr_db(r, diff)
    if _is_classifier_like(ref):
        classes = ref.shape[-1]
        ref_rows = np.nan_to_num(ref64.reshape(-1, classes), nan=-np.inf)
        cand_rows = np.nan_to_num(cand64.reshape(-1, classes), nan=-np.inf)
        for k in TOP_K:
            if classes >= k:
                result[f"top{k}_agreement"] = _topk_agreement(ref_rows, cand_rows, k)
    return result


def compare_with_float64(truth: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray],
                         candidate: Mapping[str, np.ndarray], *, detections: Sequence = ()) -> dict[str, OutputMetrics]:
    """The candidate against the float64 ``truth``, with the fp32 ``reference``'s own distance from
    it and their ratio on every floating output (see the module docstring; detections' outputs, whose
    rows need not correspond, get no distances)."""
    from edgebuild.verify.detections import detection_outputs

    metrics = compare(truth, candidate, detections=detections)
    grouped = detection_outputs(detections)
    for name, exact in truth.items():
        if np.asarray(exact).dtype.kind == "f" and name not in grouped:
            metrics[name].update(distances_from_float64(name, exact, reference[name], metrics[name]["max_abs"]))
    return metrics


def distances_from_float64(name: str, exact: np.ndarray, reference: np.ndarray, candidate_max_abs: float) -> OutputMetrics:
    """``fp32_reference_cosine``, ``fp32_reference_max_abs`` and ``noise_ratio`` of one output."""
    ref = compare_output(name, exact, np.asarray(reference).reshape(np.shape(exact)))
    finite = np.abs(np.asarray(exact, dtype=np.float64))
    finite = finite[np.isfinite(finite)]
    floor = NOISE_FLOOR_EPS * FLOAT32_EPS * float(finite.max()) if finite.size else 0.0
    denominator = max(ref["max_abs"], floor)
    ratio = candidate_max_abs / denominator if denominator > 0 else (0.0 if candidate_max_abs == 0 else float("inf"))
    return {"fp32_reference_cosine": ref["cosine"], "fp32_reference_max_abs": ref["max_abs"], "noise_ratio": ratio}


def aggregate(samples: Sequence[Mapping[str, OutputMetrics]]) -> dict[str, dict[str, dict[str, float]]]:
    """``{output: {metric: {statistic: value}}}`` over the per-sample results, for each of
    ``STATISTICS``: the mean, percentiles 1, 10, 50, 90, 99 (linear interpolation) and the extremes.

    A metric missing from some samples is aggregated over the samples that have it.
    """
    collected: dict[str, dict[str, list[float]]] = {}
    for sample in samples:
        for output, metrics in sample.items():
            per_output = collected.setdefault(output, {})
            for metric, value in metrics.items():
                per_output.setdefault(metric, []).append(float(value))
    return {
        output: {metric: _statistics(values) for metric, values in metrics.items()}
        for output, metrics in collected.items()
    }


def error_histogram(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray], *,
                    skip: Sequence = ()) -> dict[str, dict]:
    """Per output: counts of ``|c - r|`` in ``HISTOGRAM_EDGES`` bins (finite elements only).

    ``{"edges": [...], "counts": [...]}`` where ``counts[i]`` covers ``[edges[i-1], edges[i])``,
    ``counts[0]`` everything below ``edges[0]`` and ``counts[-1]`` everything from ``edges[-1]``.
    The outputs of the ``skip`` detection groups are left out: their rows need not correspond.
    """
    from edgebuild.verify.detections import detection_outputs

    skipped = detection_outputs(skip)
    histograms = {}
    for name, ref in reference.items():
        if name in skipped:
            continue
        cand = _candidate_output(name, ref, candidate)
        r = np.asarray(ref, dtype=np.float64).reshape(-1)
        c = np.asarray(cand, dtype=np.float64).reshape(-1)
        keep = np.isfinite(r) & np.isfinite(c)
        bins = np.searchsorted(HISTOGRAM_EDGES, np.abs(c[keep] - r[keep]), side="right")
        counts = np.bincount(bins, minlength=len(HISTOGRAM_EDGES) + 1)
        histograms[name] = {"edges": list(HISTOGRAM_EDGES), "counts": [int(n) for n in counts]}
    return histograms


def merge_histograms(histograms: Sequence[Mapping[str, dict]]) -> dict[str, dict]:
    """Sum per-sample ``error_histogram`` results."""
    merged: dict[str, dict] = {}
    for sample in histograms:
        for name, hist in sample.items():
            if name not in merged:
                merged[name] = {"edges": list(hist["edges"]), "counts": list(hist["counts"])}
            else:
                merged[name]["counts"] = [a + b for a, b in zip(merged[name]["counts"], hist["counts"])]
    return merged


def _candidate_output(name: str, ref: np.ndarray, candidate: Mapping[str, np.ndarray]) -> np.ndarray:
    if name not in candidate:
        raise BuildError(
            f"validate: the candidate has no output '{name}' (it has: {', '.join(candidate) or 'none'})",
            hint="the artifact's outputs must keep the source model's names",
        )
    cand = np.asarray(candidate[name])
    ref = np.asarray(ref)
    # Runtimes may add or drop unit dimensions ([1, 1000] vs [1000]); same size compares flat.
    if cand.shape != ref.shape and cand.size != ref.size:
        raise BuildError(f"validate: output '{name}' has shape {list(cand.shape)} in the candidate, {list(ref.shape)} in the reference")
    return cand.reshape(ref.shape)


def _is_classifier_like(ref: np.ndarray) -> bool:
    return ref.dtype.kind == "f" and ref.ndim >= 1 and ref.shape[-1] >= 2


def _cosine(r: np.ndarray, c: np.ndarray) -> float:
    norm_r, norm_c = np.linalg.norm(r), np.linalg.norm(c)
    if norm_r == 0 and norm_c == 0:
        return 1.0
    if norm_r == 0 or norm_c == 0:
        return 0.0
    return float(np.clip(np.dot(r, c) / (norm_r * norm_c), -1.0, 1.0))


def _snr_db(r: np.ndarray, abs_diff: np.ndarray) -> float:
    noise = float(np.sum(abs_diff**2))
    signal = float(np.sum(r**2))
    if noise == 0:
        return float("inf")
    if signal == 0:
        return float("-inf")
    return 10.0 * float(np.log10(signal / noise))


def _topk_agreement(ref_rows: np.ndarray, cand_rows: np.ndarray, k: int) -> float:
    if k == 1:
        return float(np.mean(np.argmax(ref_rows, axis=1) == np.argmax(cand_rows, axis=1)))
    top_ref = np.argpartition(-ref_rows, k - 1, axis=1)[:, :k]
    top_cand = np.argpartition(-cand_rows, k - 1, axis=1)[:, :k]
    in_cand = np.zeros(ref_rows.shape, dtype=bool)
    np.put_along_axis(in_cand, top_cand, True, axis=1)
    shared = np.take_along_axis(in_cand, top_ref, axis=1).sum(axis=1)
    return float(np.mean(shared / k))


def _statistics(values: list[float]) -> dict[str, float]:
    array = np.asarray(values, dtype=np.float64)
    finite = array[np.isfinite(array)]
    # Percentiles and means of inf (identical outputs' SNR) are meaningless; use the finite ones
    # unless there are none, and keep min/max exact.
    basis = finite if finite.size else array
    with np.errstate(invalid="ignore"):
        stats = {"avg": float(np.mean(basis))}
        stats.update((f"p{q}", float(np.percentile(basis, q))) for q in (1, 10, 50, 90, 99))
        return {**stats, "max": float(np.max(array)), "min": float(np.min(array))}
