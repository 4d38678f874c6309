"""The fp16 guard judges a detector's outputs as validation does: boxes matched by IoU.

The hand-built detector scores sixteen boxes within a hair of each other (a random head's
sigmoid near 0.5) and sorts them (``topk``) before returning boxes and scores: fp16 rounds the
scores into ties, the sort reorders the boxes, and a cosine over the outputs measures the order.
Judged that way the guard keeps the scoring in fp32; judged by matching (``validate.detections``)
the same boxes find each other and nothing needs fp32, unless a box limit asks for more than fp16
coordinates give.
"""

from __future__ import annotations

import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb

from edgebuild.plugin.validation import ValidateSection
from edgebuild_coreml import fp16_guard
from edgebuild_coreml.fp16_sensitivity import Judge, judge_for

N = 16
COSINE_MIN = 0.999


def detector():
    @mb.program(input_specs=[mb.TensorSpec(shape=(N, 4)), mb.TensorSpec(shape=(N,))])
    def prog(corners, logits):
        placed = mb.mul(x=corners, y=np.float32(1.0), name="placed")  # the box regression's last op
        scored = mb.sigmoid(x=logits, name="scored")
        scores, order = mb.topk(x=scored, k=N, axis=0, name="ranked")
        boxes = mb.gather(x=placed, indices=order, axis=0, name="sorted_boxes")
        return mb.mul(x=boxes, y=np.float32(1.0), name="boxes"), mb.mul(x=scores, y=np.float32(1.0), name="scores")
    return prog


def samples(count: int = 2):
    rng = np.random.default_rng(0)
    found = []
    for _ in range(count):
        corner = rng.uniform(0, 200, (N, 2))
        size = rng.uniform(20, 80, (N, 2))
        found.append({"corners": np.concatenate([corner, corner + size], axis=1).astype(np.float32),
                      "logits": rng.uniform(0, 0.004, N).astype(np.float32)})
    return found


def section(**thresholds) -> ValidateSection:
    return ValidateSection(detections=[{"boxes": "det_boxes", "scores": "det_scores"}],
                           thresholds={"cosine_min": COSINE_MIN, **thresholds})


NAMES = {"det_boxes": "boxes", "det_scores": "scores"}  # the model's output names -> the program's


def guard(judge=None):
    return fp16_guard.find_overflows(detector(), samples(), cosine_min=COSINE_MIN, judge=judge)


def test_plain_cosine_over_sorted_boxes_keeps_the_scoring_in_fp32():
    precision = guard().precision
    assert precision.judged_as == "cosine"
    assert precision.fp16_cosine < COSINE_MIN  # the reordering, not the boxes
    assert "scored" in precision.kept


@pytest.mark.parametrize("limits", [{}, {"box_match_min": 0.9, "box_iou_min": 0.99},
                                    {"box_recall_min": 0.95, "box_precision_min": 0.95}])
def test_matched_boxes_keep_nothing_in_fp32(limits):
    judge = judge_for(section(**limits), COSINE_MIN, NAMES)
    assert [g.boxes for g in judge.detections] == ["boxes"] and [g.scores for g in judge.detections] == ["scores"]
    precision = guard(judge).precision
    assert precision.judged_as == "detections" and precision.to_json()["judged_as"] == "detections"
    assert precision.kept == {} and precision.fp16_cosine > 1 - (1 - COSINE_MIN) / 2


def test_a_box_limit_fp16_coordinates_cannot_meet_keeps_the_boxes_in_fp32():
    # fp16 rounds coordinates near 200 to steps of 0.125: a mean IoU of 0.99999 needs them fp32
    judge = judge_for(section(box_iou_min=0.99999), COSINE_MIN, NAMES)
    assert judge.box_limits == {"box_iou": 0.99999}
    precision = guard(judge).precision
    assert precision.fp16_cosine < COSINE_MIN
    assert "placed" in precision.kept and "scored" not in precision.kept


def test_per_output_box_limits_apply_to_their_group():
    validate = ValidateSection(detections=[{"boxes": "det_boxes", "scores": "det_scores"}],
                               thresholds={"cosine_min": COSINE_MIN, "box_match_min": 0.5},
                               per_output={"det_boxes": {"thresholds": {"box_match_min": 0.8}}})
    assert judge_for(validate, COSINE_MIN, NAMES).box_limits == {"box_match": 0.8}
    assert judge_for(ValidateSection(), COSINE_MIN, NAMES) == Judge(COSINE_MIN)


@pytest.mark.parametrize("metric", ["box_match", "box_recall", "box_precision"])
def test_a_box_metric_at_its_limit_scores_as_cosine_min(metric):
    # ten separate boxes; one missing on the candidate side, or one extra
    rng = np.random.default_rng(1)
    corner = np.arange(10, dtype=np.float32)[:, None] * 100 + rng.uniform(0, 5, (10, 2)).astype(np.float32)
    boxes = np.concatenate([corner, corner + 50], axis=1)
    scores = np.linspace(0.9, 0.5, 10, dtype=np.float32)
    reference = {"boxes": boxes, "scores": scores}
    missing = {"boxes": boxes[:9], "scores": scores[:9]}
    extra = {"boxes": np.concatenate([boxes, boxes[:1] + 2000]), "scores": np.concatenate([scores, scores[:1]])}
    group = section().detections[0].model_copy(update={"boxes": "boxes", "scores": "scores"})
    for limit in (0.9, 0.8):
        judge = Judge(COSINE_MIN, (group,), {metric: limit})
        # (candidate, the metric's value): 9 of 10 reference boxes matched, or 10 of 11 candidate boxes
        cases = {"box_recall": [(missing, 0.9)], "box_precision": [(extra, 10 / 11)],
                 "box_match": [(missing, 0.9), (extra, 10 / 11)]}[metric]
        for candidate, value in cases:
            expected = 1 - (1 - value) * (1 - COSINE_MIN) / (1 - limit)
            assert judge.score(reference, candidate) == pytest.approx(expected, abs=1e-9)
        assert judge.score(reference, reference) == pytest.approx(1.0)


def test_non_finite_boxes_score_as_a_failure():
    boxes = np.array([[0, 0, 10, 10], [20, 20, 40, 40]], np.float32)
    group = section().detections[0].model_copy(update={"boxes": "boxes", "scores": "scores"})
    scores = np.array([0.9, 0.8], np.float32)
    broken = boxes.copy()
    broken[1, 2] = np.nan
    assert Judge(COSINE_MIN, (group,)).score({"boxes": boxes, "scores": scores},
                                             {"boxes": broken, "scores": scores}) == -1.0
