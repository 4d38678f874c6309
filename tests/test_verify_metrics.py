"""Metrics and thresholds against formulas worked out by hand on small arrays."""

import math

import numpy as np
import pytest
from pydantic import ValidationError

from edgebuild.errors import BuildError
from edgebuild.recipe.validation import OutputOverride, Thresholds
from edgebuild.verify.metrics import REL_FLOOR, aggregate, compare, error_histogram, merge_histograms
from edgebuild.verify.thresholds import aggregation_for, check, limits_for


def test_error_metrics_match_hand_computation():
    ref = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    cand = np.array([1.1, 2.0, 2.7, 4.0], dtype=np.float32)
    m = compare({"y": ref}, {"y": cand})["y"]
    # |d| = [0.1, 0, 0.3, 0]; sorted [0, 0, 0.1, 0.3]
    assert m["max_abs"] == pytest.approx(0.3, rel=1e-6)
    assert m["mean_abs"] == pytest.approx(0.1, rel=1e-6)
    assert m["p90_abs"] == pytest.approx(0.1 + 0.7 * 0.2, rel=1e-5)  # rank 2.7 between 0.1 and 0.3
    assert m["max_rel"] == pytest.approx(0.1, rel=1e-5)  # 0.1/1 and 0.3/3
    r, c = ref.astype(np.float64), cand.astype(np.float64)
    assert m["cosine"] == pytest.approx(r @ c / math.sqrt((r @ r) * (c @ c)), rel=1e-12)
    assert m["snr_db"] == pytest.approx(10 * math.log10(30 / 0.1), rel=1e-5)
    assert m["nonfinite"] == 0


def test_relative_error_uses_floor_near_zero():
    m = compare({"y": np.array([0.0, 1.0])}, {"y": np.array([1e-4, 1.0])})["y"]
    assert m["max_rel"] == pytest.approx(1e-4 / REL_FLOOR)


def test_identical_outputs():
    ref = np.linspace(-1, 1, 12).reshape(3, 4)
    m = compare({"y": ref}, {"y": ref.copy()})["y"]
    assert m["max_abs"] == 0 and m["snr_db"] == math.inf
    assert m["cosine"] == pytest.approx(1.0, abs=1e-12)  # rounding may leave 1 - 2e-16
    assert m["top1_agreement"] == 1.0
    assert "top5_agreement" not in m  # only 4 classes


def test_cosine_of_zero_vectors():
    zeros = np.zeros(5)
    assert compare({"y": zeros}, {"y": zeros})["y"]["cosine"] == 1.0
    assert compare({"y": zeros}, {"y": np.ones(5)})["y"]["cosine"] == 0.0


def test_topk_agreement_counts_shared_classes():
    ref = np.array([[0, 1, 2, 3, 4, 5, 6.0], [6, 5, 4, 3, 2, 1, 0.0]])
    cand = ref.copy()
    cand[0, [6, 5]] = cand[0, [5, 6]]          # row 0: argmax moves, top-5 set unchanged
    cand[1, 0], cand[1, 6] = -1.0, 10.0        # row 1: argmax moves and class 0 leaves the top 5
    m = compare({"logits": ref}, {"logits": cand})["logits"]
    assert m["top1_agreement"] == 0.0
    assert m["top5_agreement"] == pytest.approx((5 / 5 + 4 / 5) / 2)


def test_integer_outputs_have_no_topk():
    ref = np.array([[1, 2, 3]], dtype=np.int64)
    m = compare({"idx": ref}, {"idx": ref})["idx"]
    assert "top1_agreement" not in m and m["max_abs"] == 0


def test_nonfinite_candidate_counted_and_excluded():
    ref = np.array([1.0, 2.0, 3.0, np.nan])
    cand = np.array([1.0, np.nan, np.inf, np.nan])  # NaN where the reference is NaN is not the candidate's fault
    m = compare({"y": ref}, {"y": cand})["y"]
    assert m["nonfinite"] == 2
    assert m["max_abs"] == 0.0 and m["cosine"] == pytest.approx(1.0)


def test_unit_dims_compare_flat_but_sizes_must_match():
    ref = np.arange(6.0).reshape(1, 6)
    assert compare({"y": ref}, {"y": np.arange(6.0)})["y"]["max_abs"] == 0
    with pytest.raises(BuildError, match="'y' has shape"):
        compare({"y": ref}, {"y": np.arange(5.0)})
    with pytest.raises(BuildError, match="no output 'y'"):
        compare({"y": ref}, {"z": ref})


def test_aggregate_statistics():
    values = [0.1, 0.5, 0.2, 0.9]
    agg = aggregate([{"y": {"max_abs": v}} for v in values])["y"]["max_abs"]
    assert agg["avg"] == pytest.approx(np.mean(values))
    assert agg["p90"] == pytest.approx(np.percentile(values, 90))
    assert agg["p99"] == pytest.approx(np.percentile(values, 99))
    assert (agg["min"], agg["max"]) == (0.1, 0.9)


def test_aggregate_keeps_inf_extremes_but_averages_finite():
    agg = aggregate([{"y": {"snr_db": v}} for v in (20.0, math.inf, 40.0)])["y"]["snr_db"]
    assert agg["avg"] == 30.0 and agg["max"] == math.inf and agg["min"] == 20.0


def test_histograms_cover_every_finite_element_and_merge():
    ref = {"y": np.zeros(100)}
    cand = {"y": np.concatenate([np.zeros(10), np.full(40, 2e-3), np.full(50, 5e3)])}
    hist = error_histogram(ref, cand)["y"]
    counts, edges = np.array(hist["counts"]), np.array(hist["edges"])
    assert counts.sum() == 100 and counts[0] == 10 and counts[-1] == 50
    assert counts[np.searchsorted(edges, 2e-3, side="right")] == 40
    assert edges[np.searchsorted(edges, 2e-3, side="right") - 1] <= 2e-3 < edges[np.searchsorted(edges, 2e-3, side="right")]
    merged = merge_histograms([{"y": hist}, {"y": hist}])["y"]
    assert merged["counts"] == [2 * c for c in hist["counts"]]


# -- thresholds -----------------------------------------------------------------------------

def _agg(**metrics):
    """Aggregated metrics for one output 'logits' where min/max are the given (worst, best) pairs."""
    return {"logits": {name: {"avg": v[1], "p90": v[1], "p99": v[1], "min": v[0], "max": v[1]} for name, v in metrics.items()}}


def test_min_threshold_uses_worst_sample():
    aggregated = _agg(cosine=(0.9812, 0.9999))
    failures = check(aggregated, {"cosine_min": 0.995}, {})
    assert len(failures) == 1
    f = failures[0]
    assert (f.output, f.metric, f.value, f.limit) == ("logits", "cosine", 0.9812, 0.995)
    assert f.message == "output 'logits': cosine 0.9812 < cosine_min 0.995"
    assert check(aggregated, {"cosine_min": 0.98}, {}) == []


def test_max_threshold_uses_worst_sample():
    aggregated = _agg(max_abs=(0.01, 0.25))
    [f] = check(aggregated, Thresholds(max_abs_max=0.1), None)
    assert f.message == "output 'logits': max_abs 0.25 > max_abs_max 0.1"
    assert check(aggregated, {"max_abs_max": 0.3}) == []


def test_empty_thresholds_report_only():
    assert check(_agg(cosine=(0.1, 0.2), max_abs=(5.0, 9.0)), {}, {}) == []


def test_per_output_override_replaces_global_limit():
    aggregated = _agg(cosine=(0.99, 0.999))
    overrides = {"logits": {"thresholds": {"cosine_min": 0.98}}}
    assert check(aggregated, {"cosine_min": 0.995}, overrides) == []
    assert check(aggregated, {"cosine_min": 0.995}, {"logits": OutputOverride(thresholds=Thresholds(cosine_min=0.999))})
    assert limits_for({"cosine_min": 0.995, "snr_db_min": 30}, overrides, "logits") == {"cosine_min": 0.98, "snr_db_min": 30}


def test_missing_metric_fails_only_when_asked_for_explicitly():
    aggregated = _agg(cosine=(0.999, 1.0))  # no top1: not a classifier
    assert check(aggregated, {"top1_agreement_min": 0.9}, {}) == []
    [f] = check(aggregated, {}, {"logits": {"thresholds": {"top1_agreement_min": 0.9}}})
    assert "top1_agreement is not available" in f.message


def test_nonfinite_candidate_always_fails():
    aggregated = _agg(nonfinite=(0.0, 3.0), cosine=(0.999, 1.0))
    [f] = check(aggregated, {}, {})
    assert f.metric == "nonfinite" and "candidate has NaN/inf" in f.message


def test_nan_metric_fails_instead_of_passing_silently():
    [f] = check(_agg(cosine=(float("nan"), float("nan"))), {"cosine_min": 0.9})
    assert "NaN" in f.message


def test_unknown_output_in_per_output_fails():
    [f] = check(_agg(cosine=(1.0, 1.0)), {}, {"probs": {"thresholds": {"cosine_min": 0.9}}})
    assert "'probs'" in f.message and "logits" in f.message


def test_end_to_end_with_noise():
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(4):
        ref = rng.normal(size=(2, 10))
        samples.append(compare({"logits": ref}, {"logits": ref + rng.normal(scale=0.5, size=ref.shape)}))
    aggregated = aggregate(samples)
    worst = min(s["logits"]["cosine"] for s in samples)
    [f] = check(aggregated, {"cosine_min": 0.999})
    assert f.value == worst


# -- which statistic over the samples a limit is held against --------------------------------

def _classifier_samples(agreeing: list[bool]) -> list[dict]:
    """One batch-1 classifier sample per entry: the candidate's argmax agrees or not."""
    samples = []
    for agree in agreeing:
        ref = np.array([[0.1, 0.7, 0.2]])
        cand = ref.copy() if agree else np.array([[0.7, 0.1, 0.2]])
        samples.append(compare({"logits": ref}, {"logits": cand}))
    return samples


def test_top1_agreement_limit_applies_to_the_rate_over_samples():
    aggregated = aggregate(_classifier_samples([True] * 9 + [False]))
    assert aggregated["logits"]["top1_agreement"]["min"] == 0.0  # one sample disagrees ...
    assert check(aggregated, {"top1_agreement_min": 0.9}) == []  # ... and the rate is 0.9
    [f] = check(aggregated, {"top1_agreement_min": 0.95})
    assert (f.value, f.statistic) == (pytest.approx(0.9), "mean")
    assert f.message == "output 'logits': top1_agreement (mean over the samples) 0.9 < top1_agreement_min 0.95"


def test_recipe_can_hold_a_limit_to_another_statistic():
    values = [0.9999, 0.9998, 0.9997, 0.9996, 0.9995, 0.9994, 0.9993, 0.9992, 0.9991, 0.9990, 0.95]  # p10: the 2nd lowest
    aggregated = aggregate([{"y": {"cosine": v}} for v in values])
    assert check(aggregated, {"cosine_min": 0.999})  # the worst sample, by default
    assert check(aggregated, {"cosine_min": 0.999, "aggregate": {"cosine": "p10"}}) == []  # one in eleven below
    assert check(aggregated, {"cosine_min": 0.99, "aggregate": {"cosine": "mean"}}) == []
    [f] = check(aggregated, {"cosine_min": 0.9995, "aggregate": {"cosine": "median"}})
    assert f.value == pytest.approx(np.median(values)) and f.statistic == "median"
    strict = {"top1_agreement_min": 0.95, "aggregate": {"top1_agreement": "worst"}}
    assert check(aggregate(_classifier_samples([True] * 19 + [False])), strict)


def test_aggregation_in_per_output_overrides_merges_with_the_global_one():
    thresholds = {"cosine_min": 0.99, "max_abs_max": 0.1, "aggregate": {"cosine": "mean"}}
    overrides = {"y": {"thresholds": {"aggregate": {"max_abs": "p90"}}}}
    assert aggregation_for(thresholds, overrides, "y") == {"cosine": "mean", "max_abs": "p90"}
    assert aggregation_for(thresholds, {}, "y") == {"cosine": "mean", "max_abs": "worst"}
    assert "aggregate" not in limits_for(thresholds, overrides, "y")


@pytest.mark.parametrize("aggregate_", [{"cosin": "mean"}, {"cosine": "average"}, {"cosine": "p50"}])
def test_a_misspelt_aggregation_is_a_recipe_error(aggregate_):
    with pytest.raises(ValidationError):
        Thresholds.model_validate({"cosine_min": 0.99, "aggregate": aggregate_})


def test_failure_shows_enough_digits_to_tell_value_from_limit():
    [f] = check(aggregate([{"y": {"cosine": 0.9999899}}]), {"cosine_min": 0.99999})
    assert "0.9999899 < cosine_min 0.99999" in f.message


def test_aggregate_keeps_low_percentiles_for_min_limits():
    values = list(np.linspace(0.0, 1.0, 11))
    stats = aggregate([{"y": {"cosine": v}} for v in values])["y"]["cosine"]
    assert stats["p10"] == pytest.approx(0.1) and stats["p1"] == pytest.approx(0.01) and stats["p50"] == pytest.approx(0.5)
