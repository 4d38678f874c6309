"""Detections compared by IoU matching (validate.detections): the metric over its class of cases."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from edgebuild.errors import BuildError
from edgebuild.recipe.validation import DetectionOutputs, Thresholds, ValidateSection
from edgebuild.verify.detections import iou_matrix
from edgebuild.verify.metrics import aggregate, compare, compare_with_float64, error_histogram
from edgebuild.verify.thresholds import check

GROUP = DetectionOutputs(boxes="boxes", scores="scores", labels="labels")
# Four well-separated boxes, scores well above any cut.
BOXES = np.array([[0, 0, 10, 10], [20, 20, 40, 40], [50, 0, 60, 30], [0, 50, 30, 60]], dtype=np.float32)
SCORES = np.array([0.9, 0.8, 0.7, 0.6], dtype=np.float32)
LABELS = np.array([1, 2, 1, 3], dtype=np.int64)


def outputs(boxes=BOXES, scores=SCORES, labels=LABELS, batch=()):
    """The three outputs, repeated over ``batch`` dims."""
    def tile(array):
        return np.broadcast_to(array, (*batch, *array.shape)).copy()

    return {"boxes": tile(np.asarray(boxes, np.float32).reshape(-1, 4)), "scores": tile(np.asarray(scores, np.float32)),
            "labels": tile(np.asarray(labels, np.int64))}


def box_metrics(reference, candidate, group=GROUP):
    return compare(reference, candidate, detections=[group])["boxes"]


BATCHES = [(), (1,), (3,), (2, 2)]


@pytest.mark.parametrize("batch", BATCHES)
def test_identical_detections_match_fully(batch):
    found = box_metrics(outputs(batch=batch), outputs(batch=batch))
    images = int(np.prod(batch, dtype=int))
    assert found["box_match"] == found["box_recall"] == found["box_precision"] == 1.0
    assert found["box_iou"] == pytest.approx(1.0)
    assert found["box_score_diff"] == pytest.approx(0.0, abs=1e-12)
    assert found["box_reference"] == found["box_candidate"] == 4 * images
    assert found["cosine"] == pytest.approx(1.0)


@pytest.mark.parametrize("batch", BATCHES)
def test_empty_outputs_on_both_sides_agree(batch):
    empty = outputs(np.zeros((0, 4)), np.zeros(0), np.zeros(0), batch=batch)
    found = compare(empty, empty, detections=[GROUP])
    assert found["boxes"]["box_match"] == 1.0
    assert "box_iou" not in found["boxes"]  # no pair, no mean
    assert check(aggregate([found]), {"box_match_min": 1.0, "cosine_min": 0.999}) == []


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("seed", range(3))
def test_a_permuted_order_changes_nothing(batch, seed):
    order = np.random.default_rng(seed).permutation(len(BOXES))
    found = compare(outputs(batch=batch), outputs(BOXES[order], SCORES[order], LABELS[order], batch=batch),
                    detections=[GROUP])
    assert found["boxes"]["box_match"] == 1.0
    for name in ("boxes", "scores", "labels"):  # the ordinary metrics over the pairs, in matched order
        assert found[name]["max_abs"] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("dropped", range(len(BOXES)))
@pytest.mark.parametrize("side", ["candidate", "reference"])
def test_a_dropped_box_lowers_recall_or_precision(dropped, side):
    keep = np.delete(np.arange(len(BOXES)), dropped)
    fewer = outputs(BOXES[keep], SCORES[keep], LABELS[keep])
    reference, candidate = (outputs(), fewer) if side == "candidate" else (fewer, outputs())
    found = box_metrics(reference, candidate)
    recall, precision = (0.75, 1.0) if side == "candidate" else (1.0, 0.75)
    assert found["box_recall"] == pytest.approx(recall)
    assert found["box_precision"] == pytest.approx(precision)
    assert found["box_match"] == pytest.approx(0.75)
    [failure] = check(aggregate([{"boxes": found}]), {"box_match_min": 0.9})
    assert failure.metric == "box_match" and failure.output == "boxes"


@pytest.mark.parametrize("swapped", range(len(BOXES)))
def test_a_label_swap_unmatches_the_box(swapped):
    labels = LABELS.copy()
    labels[swapped] = 7
    found = box_metrics(outputs(), outputs(labels=labels))
    assert found["box_recall"] == pytest.approx(0.75) and found["box_precision"] == pytest.approx(0.75)


def test_without_labels_any_box_matches_any_box():
    group = DetectionOutputs(boxes="boxes", scores="scores")
    labels = LABELS[::-1].copy()
    assert box_metrics(outputs(), outputs(labels=labels), group)["box_match"] == 1.0


@pytest.mark.parametrize("shift", [0.0, 1.0, 2.0, 4.0])
def test_iou_of_shifted_boxes_and_the_match_limit(shift):
    moved = BOXES + np.array([shift, 0, shift, 0], dtype=np.float32)
    found = box_metrics(outputs(), outputs(moved))
    expected = iou_matrix(BOXES, moved).diagonal()
    matched = expected >= GROUP.iou
    assert found["box_recall"] == pytest.approx(matched.mean())
    if matched.any():
        assert found["box_iou"] == pytest.approx(expected[matched].mean())


def test_score_differences_of_pairs_are_reported():
    found = box_metrics(outputs(), outputs(scores=SCORES + np.float32(0.01)))
    assert found["box_score_diff"] == pytest.approx(0.01, abs=1e-6)
    [failure] = check(aggregate([{"boxes": found}]), {"box_score_diff_max": 0.001})
    assert failure.metric == "box_score_diff"


def test_each_reference_box_takes_the_best_unmatched_candidate():
    # two candidates on one reference box: the closer one is its match, the other is left over
    reference = outputs(BOXES[:1], SCORES[:1], LABELS[:1])
    candidate = outputs(np.array([[1, 0, 11, 10], [0, 0, 10, 10]]), [0.9, 0.9], [1, 1])
    found = compare(reference, candidate, detections=[GROUP])
    assert found["boxes"]["box_iou"] == pytest.approx(1.0)
    assert found["boxes"]["box_precision"] == pytest.approx(0.5)


@pytest.mark.parametrize("side", ["candidate", "reference"])
def test_a_box_near_the_score_cut_may_come_or_go(side):
    group = DetectionOutputs(boxes="boxes", scores="scores", labels="labels", score_threshold=0.55, score_margin=0.1)
    keep = [0, 1, 2]  # the 0.6 box is within the margin of the cut
    fewer = outputs(BOXES[keep], SCORES[keep], LABELS[keep])
    reference, candidate = (outputs(), fewer) if side == "candidate" else (fewer, outputs())
    found = box_metrics(reference, candidate, group)
    assert found["box_match"] == 1.0 and found["box_borderline"] == 1
    # well above the cut it counts again
    tight = group.model_copy(update={"score_margin": 0.01})
    assert box_metrics(reference, candidate, tight)["box_match"] == pytest.approx(0.75)


def test_a_matched_borderline_box_still_counts():
    group = DetectionOutputs(boxes="boxes", scores="scores", labels="labels", score_threshold=0.55, score_margin=0.1)
    found = box_metrics(outputs(), outputs(), group)
    assert found["box_reference"] == 4 and found["box_borderline"] == 0


def test_a_full_side_cuts_at_its_lowest_score():
    # both sides hold max_detections boxes; the lowest differs, as a last-bit change of the cap's cut does
    group = DetectionOutputs(boxes="boxes", scores="scores", labels="labels", max_detections=4, score_margin=0.05)
    other = np.array([[100, 100, 120, 120]], dtype=np.float32)
    candidate = outputs(np.concatenate([BOXES[:3], other]), [0.9, 0.8, 0.7, 0.599], [1, 2, 1, 3])
    assert box_metrics(outputs(), candidate, group)["box_match"] == 1.0
    assert box_metrics(outputs(), candidate, group.model_copy(update={"max_detections": None}))["box_match"] == 0.75


def test_a_box_near_the_nms_overlap_may_come_or_go():
    # the extra box overlaps the first box of its label by IoU 0.49: NMS at 0.5 keeps it by a hair
    extra = np.array([[0, 0, 10, 4.9]], dtype=np.float32)  # inside it: IoU 4.9 / 10
    overlap = iou_matrix(BOXES[:1], extra)[0, 0]
    assert 0.45 < overlap < 0.5
    candidate = outputs(np.concatenate([BOXES, extra]), [*SCORES, 0.85], [*LABELS, 1])
    group = DetectionOutputs(boxes="boxes", scores="scores", labels="labels", nms_iou=0.5, nms_margin=0.06)
    found = box_metrics(outputs(), candidate, group)
    assert found["box_match"] == 1.0 and found["box_borderline"] == 1
    assert box_metrics(outputs(), candidate, GROUP)["box_precision"] == pytest.approx(0.8)  # without nms_iou


def test_attached_outputs_are_compared_over_the_pairs():
    group = DetectionOutputs(boxes="boxes", scores="scores", labels="labels", attached=["masks"])
    masks = np.random.default_rng(0).random((4, 1, 5, 5)).astype(np.float32)
    order = np.array([2, 0, 3, 1])
    reference = {**outputs(), "masks": masks}
    candidate = {**outputs(BOXES[order], SCORES[order], LABELS[order]), "masks": masks[order]}
    found = compare(reference, candidate, detections=[group])
    assert found["masks"]["cosine"] == pytest.approx(1.0) and found["masks"]["max_abs"] == 0.0
    candidate["masks"] = masks  # rows no longer follow their boxes
    assert compare(reference, candidate, detections=[group])["masks"]["max_abs"] > 0.1


def test_other_outputs_keep_the_elementwise_metrics():
    reference = {**outputs(), "features": np.ones((2, 3), np.float32)}
    candidate = {**outputs(), "features": np.full((2, 3), 2.0, np.float32)}
    found = compare(reference, candidate, detections=[GROUP])
    assert found["features"]["max_abs"] == pytest.approx(1.0) and "box_match" not in found["features"]


def test_float64_reference_leaves_detections_without_distances():
    truth = outputs()
    fewer = outputs(BOXES[:3], SCORES[:3], LABELS[:3])
    found = compare_with_float64(truth, fewer, outputs(), detections=[GROUP])
    assert found["boxes"]["box_match"] == 1.0 and "noise_ratio" not in found["boxes"]


def test_histograms_leave_detections_out():
    assert error_histogram(outputs(), outputs(BOXES[:2], SCORES[:2], LABELS[:2]), skip=[GROUP]) == {}


def test_nan_candidate_boxes_match_nothing():
    boxes = BOXES.copy()
    boxes[1] = np.nan
    assert box_metrics(outputs(), outputs(boxes))["box_recall"] == pytest.approx(0.75)


@pytest.mark.parametrize("broken, message", [
    ({"boxes": np.zeros((4, 5), np.float32)}, "boxes are \\[..., N, 4\\]"),
    ({"scores": np.zeros(3, np.float32)}, "does not start with the boxes'"),
    ({"labels": None}, "names output 'labels', which the candidate does not have"),
])
def test_malformed_outputs_are_named(broken, message):
    candidate = {**outputs(), **broken}
    candidate = {name: value for name, value in candidate.items() if value is not None}
    with pytest.raises(BuildError, match=message):
        compare(outputs(), candidate, detections=[GROUP])


def test_batch_dims_must_agree():
    with pytest.raises(BuildError, match="holds 2 images in the reference and 3"):
        compare(outputs(batch=(2,)), outputs(batch=(3,)), detections=[GROUP])


@pytest.mark.parametrize("section, message", [
    ({"detections": [{"boxes": "a", "scores": "a"}]}, "named twice"),
    ({"detections": [{"boxes": "a"}, {"boxes": "b", "labels": "a"}]}, "detections\\[0\\] names too"),
    ({"detections": [{"boxes": "a", "score_threshold": 0.1}]}, "name the scores output"),
    ({"detections": [{"boxes": "a", "iou": 0}]}, "greater than 0"),
    ({"detections": [{"boxes": "a", "extra": 1}]}, "Extra inputs"),
    ({"thresholds": {"box_match_min": 1.5}}, "less than or equal to 1"),
    ({"thresholds": {"box_score_diff_max": -1}}, "greater than or equal to 0"),
])
def test_recipe_errors(section, message):
    with pytest.raises(ValidationError, match=message):
        ValidateSection.model_validate(section)


def test_box_limits_on_a_non_detection_output_are_skipped_unless_set_for_it():
    metrics = aggregate([{"logits": {"cosine": 1.0}}])
    assert check(metrics, Thresholds(box_match_min=0.9)) == []
    [failure] = check(metrics, None, {"logits": {"thresholds": {"box_match_min": 0.9}}})
    assert "not available" in failure.message


def test_corpus_detectors_declare_their_outputs_by_exported_order(tmp_path):
    """The corpus names a detector's outputs by torchvision's sorted keys, in the exported order."""
    import onnx
    import onnx.helper as oh
    from edgebuild_testplugin import corpus

    names = ["b", "k", "ks", "l", "s"]
    graph = oh.make_graph([oh.make_node("Identity", ["x"], [name]) for name in names], "g",
                          [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                          [oh.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [1]) for name in names])
    path = tmp_path / "detector.onnx"
    onnx.save(oh.make_model(graph), path)
    exported = corpus.Exported(path, "torchscript", ("x",), {"x": [1]}, {"x": "float32"}, 0.0)
    detector = corpus.Detector(("boxes", "keypoints", "keypoints_scores", "labels", "scores"), 0.05, 0.5, 100)
    section = corpus.detections_section(exported, detector, "float16")
    [group] = section["detections"]
    assert (group["boxes"], group["labels"], group["scores"], group["attached"]) == ("b", "l", "s", ["k", "ks"])
    parsed = ValidateSection.model_validate(section)  # what the recipe's validate section accepts
    assert parsed.detections[0].max_detections == 100 and parsed.thresholds.box_match_min is not None


@pytest.mark.parametrize("axis", [0, 1, "both"])
def test_degenerate_boxes_match_their_copy_a_last_bit_away(axis):
    # zero-width (or zero-area) boxes, as an untrained head's ReLU'd regression gives
    boxes = BOXES.copy()
    for index in ([0] if axis != "both" else [0, 1]):
        boxes[:, index] = boxes[:, index + 2]
    nudged = boxes.copy()
    nudged[:, 3] = np.nextafter(nudged[:, 3], np.float32(np.inf))
    assert box_metrics(outputs(boxes), outputs(nudged))["box_match"] == 1.0
    # a degenerate box far from the other still matches nothing
    apart = boxes + np.float32(5.0)
    assert box_metrics(outputs(boxes), outputs(apart))["box_match"] == 0.0
