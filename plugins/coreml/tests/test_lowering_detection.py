"""NonMaxSuppression and RoiAlign lowerings (lowering/ops/nms.py, roi_align.py) against onnxruntime.

Each model is lowered to MIL, run in edgebuild's MIL interpreter and compared with onnxruntime
on the same inputs. NMS results have ONNX's exact [num_selected, 3] shape, no padding.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper as oh
from onnx_cases import IR_VERSION, check, check_op, rand

F32, I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64


def corner_boxes(batch, count, seed, *, flip=False):
    rng = np.random.default_rng(seed)
    low = rng.uniform(0, 20, (batch, count, 2))
    high = low + rng.uniform(1, 8, (batch, count, 2))
    boxes = np.concatenate([high, low] if flip else [low, high], axis=-1)  # [y1, x1, y2, x2], maybe flipped
    return boxes.astype(np.float32)


def centre_boxes(batch, count, seed):
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.uniform(0, 20, (batch, count, 2)), rng.uniform(1, 8, (batch, count, 2))],
                          axis=-1).astype(np.float32)


def nms_inputs(boxes, classes, seed, *, max_boxes=5, iou=0.4, score=None):
    scores = np.random.default_rng(seed).uniform(0, 1, (boxes.shape[0], classes, boxes.shape[1])).astype(np.float32)
    return {"boxes": boxes, "scores": scores, "max_output_boxes_per_class": np.array([max_boxes], np.int64),
            "iou_threshold": np.array([iou], np.float32),
            "score_threshold": None if score is None else np.array([score], np.float32)}


NMS_CASES = {
    "batches_and_classes": (corner_boxes(2, 30, 1), 3, {}, {"score": 0.3}),
    "flipped_corners": (corner_boxes(1, 25, 2, flip=True), 2, {}, {}),
    "centre_point_boxes": (centre_boxes(2, 20, 3), 2, {"center_point_box": 1}, {"iou": 0.2, "score": 0.5}),
    "more_slots_than_boxes": (corner_boxes(1, 4, 4), 1, {}, {"max_boxes": 10, "iou": 0.9}),
    "score_threshold_drops_all_but_one_class": (corner_boxes(1, 12, 5), 2, {}, {"score": 0.0}),
}


@pytest.mark.parametrize("case", sorted(NMS_CASES))
@pytest.mark.parametrize("target", ["iOS16", "iOS18"])  # iOS15/16 and iOS17+ forms of the MIL op
def test_non_max_suppression(case, target):
    boxes, classes, attrs, options = NMS_CASES[case]
    inputs = nms_inputs(boxes, classes, seed=9, **options)
    check_op("NonMaxSuppression", inputs, attrs=attrs, opset=11, target=target,
             initializers=["max_output_boxes_per_class", "iou_threshold", "score_threshold"])


def test_detector_post_processing_graph():
    """A detector's tail: boxes and per-class scores -> NMS -> the kept boxes, classes and scores."""
    count, classes = 60, 4
    boxes = corner_boxes(1, count, 7)
    scores = np.random.default_rng(8).uniform(0, 1, (1, classes, count)).astype(np.float32)
    nodes = [
        oh.make_node("NonMaxSuppression", ["boxes", "scores", "max_per_class", "iou", "min_score"], ["selected"],
                     name="nms"),
        oh.make_node("Gather", ["selected", "col_class"], ["class_id"], axis=1, name="class_id"),
        oh.make_node("Gather", ["selected", "col_box"], ["box_id"], axis=1, name="box_id"),
        oh.make_node("Squeeze", ["boxes", "axis0"], ["boxes_2d"], name="boxes_2d"),
        oh.make_node("Gather", ["boxes_2d", "box_id"], ["kept_boxes"], axis=0, name="kept_boxes"),
        oh.make_node("Squeeze", ["scores", "axis0"], ["scores_2d"], name="scores_2d"),
        oh.make_node("Unsqueeze", ["class_id", "axis1"], ["class_col"], name="class_col"),
        oh.make_node("Unsqueeze", ["box_id", "axis1"], ["box_col"], name="box_col"),
        oh.make_node("Concat", ["class_col", "box_col"], ["pairs"], axis=1, name="pairs"),
        oh.make_node("GatherND", ["scores_2d", "pairs"], ["kept_scores"], name="kept_scores"),
    ]
    initializers = [
        oh.make_tensor("max_per_class", I64, [1], [8]), oh.make_tensor("iou", F32, [1], [0.45]),
        oh.make_tensor("min_score", F32, [1], [0.25]), oh.make_tensor("col_class", I64, [], [1]),
        oh.make_tensor("col_box", I64, [], [2]), oh.make_tensor("axis0", I64, [1], [0]),
        oh.make_tensor("axis1", I64, [1], [1]),
    ]
    graph = oh.make_graph(
        nodes, "detector_tail",
        [oh.make_tensor_value_info("boxes", F32, [1, count, 4]), oh.make_tensor_value_info("scores", F32, [1, classes, count])],
        [oh.make_tensor_value_info(name, elem, None) for name, elem in
         (("kept_boxes", F32), ("kept_scores", F32), ("class_id", I64), ("selected", I64))],
        initializers)
    model = onnx.shape_inference.infer_shapes(
        oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)], ir_version=IR_VERSION))
    out = check(model, {"boxes": boxes, "scores": scores})
    assert 0 < len(out["selected"]) <= 8 * classes


ROI_CASES = {
    "avg_half_pixel": ({"output_height": 3, "output_width": 4, "sampling_ratio": 2}, 0.5),
    "max_output_half_pixel": ({"mode": "max", "output_height": 2, "output_width": 2, "sampling_ratio": 3,
                               "coordinate_transformation_mode": "output_half_pixel"}, 1.0),
    "one_sample_per_bin": ({"output_height": 5, "output_width": 3, "sampling_ratio": 1}, 0.25),
}


def roi_inputs(scale):
    x = rand(2, 3, 12, 10, seed=21)
    rng = np.random.default_rng(22)
    low = rng.uniform(-2, 7, (6, 2)) / scale
    rois = np.concatenate([low, low + rng.uniform(0.5, 6, (6, 2)) / scale], axis=1).astype(np.float32)
    return {"X": x, "rois": rois, "batch_indices": np.array([0, 1, 1, 0, 1, 0], np.int64)}


@pytest.mark.parametrize("case", sorted(ROI_CASES))
def test_roi_align(case):
    attrs, scale = ROI_CASES[case]
    check_op("RoiAlign", roi_inputs(scale), attrs={**attrs, "spatial_scale": scale}, opset=16, rtol=1e-4, atol=1e-5)


def test_roi_align_adaptive_grid_with_constant_rois():
    inputs = roi_inputs(1.0)
    inputs["rois"] = np.array([[1, 1, 5, 7], [0, 2, 4, 8], [2, 0, 6, 6]], np.float32)  # one grid size: 2 x 2
    inputs["batch_indices"] = np.array([1, 0, 1], np.int64)
    check_op("RoiAlign", inputs, attrs={"output_height": 2, "output_width": 3, "sampling_ratio": 0}, opset=16,
             initializers=["rois", "batch_indices"], rtol=1e-4, atol=1e-5)


def test_roi_align_adaptive_grid_needs_constant_rois():
    from edgebuild_coreml.lowering.errors import LoweringError
    from onnx_cases import lower, single_node_model

    model = single_node_model("RoiAlign", roi_inputs(1.0), attrs={"sampling_ratio": 0}, opset=16)
    with pytest.raises(LoweringError, match="sampling_ratio 0"):
        lower(model)


@pytest.mark.parametrize("kept", [4, 0])  # some proposals, none
def test_roi_align_over_rois_the_data_selects(kept):
    """A two-stage detector's box head: the rois are the proposals whose score passes a threshold
    (NonZero then Gather), so their count is decided at run time, and may be zero."""
    inputs = roi_inputs(0.5)
    scores = np.zeros(6, np.float32)
    scores[np.random.default_rng(23).permutation(6)[:kept]] = 0.9
    nodes = [
        oh.make_node("Greater", ["scores", "threshold"], ["passed"], name="passed"),
        oh.make_node("NonZero", ["passed"], ["where"], name="where"),
        oh.make_node("Squeeze", ["where", "axis0"], ["picked"], name="picked"),
        oh.make_node("Gather", ["rois", "picked"], ["kept_rois"], axis=0, name="kept_rois"),
        oh.make_node("Gather", ["batch_indices", "picked"], ["kept_images"], axis=0, name="kept_images"),
        oh.make_node("RoiAlign", ["X", "kept_rois", "kept_images"], ["pooled"], name="pool", output_height=3,
                     output_width=2, sampling_ratio=2, spatial_scale=0.5),
    ]
    graph = oh.make_graph(
        nodes, "box_head",
        [oh.make_tensor_value_info("X", F32, [2, 3, 12, 10]), oh.make_tensor_value_info("rois", F32, [6, 4]),
         oh.make_tensor_value_info("batch_indices", I64, [6]), oh.make_tensor_value_info("scores", F32, [6])],
        [oh.make_tensor_value_info("pooled", F32, None)],
        [oh.make_tensor("threshold", F32, [], [0.5]), oh.make_tensor("axis0", I64, [1], [0])])
    model = onnx.shape_inference.infer_shapes(
        oh.make_model(graph, opset_imports=[oh.make_opsetid("", 16)], ir_version=IR_VERSION))
    out = check(model, {**inputs, "scores": scores}, rtol=1e-4, atol=1e-5)
    assert out["pooled"].shape == (kept, 3, 3, 2)


@pytest.mark.parametrize("level", [1, 3])  # some rois on the level, none
def test_scatter_elements_of_the_rois_of_one_level(level):
    """MultiScaleRoIAlign's merge: the rows of the rois of one level (NonZero of a mask, so a count
    the data decides) are scattered back into the full [R, C] result with ScatterElements."""
    levels = np.array([0, 1, 2, 1, 0, 1], np.int64)
    values = rand(6, 3, seed=24)
    nodes = [
        oh.make_node("Equal", ["levels", "level"], ["on_level"], name="on_level"),
        oh.make_node("NonZero", ["on_level"], ["where"], name="where"),
        oh.make_node("Reshape", ["where", "column"], ["rows"], name="rows"),
        oh.make_node("Squeeze", ["where", "axis0"], ["picked"], name="picked"),
        oh.make_node("Gather", ["values", "picked"], ["pooled"], axis=0, name="pooled"),
        oh.make_node("Shape", ["pooled"], ["pooled_shape"], name="pooled_shape"),
        oh.make_node("Expand", ["rows", "pooled_shape"], ["row_indices"], name="row_indices"),
        oh.make_node("ScatterElements", ["zeros", "row_indices", "pooled"], ["merged"], axis=0, name="merged"),
    ]
    graph = oh.make_graph(
        nodes, "merge_levels",
        [oh.make_tensor_value_info("levels", I64, [6]), oh.make_tensor_value_info("values", F32, [6, 3]),
         oh.make_tensor_value_info("zeros", F32, [6, 3])],
        [oh.make_tensor_value_info("merged", F32, None)],
        [oh.make_tensor("level", I64, [], [level]), oh.make_tensor("column", I64, [2], [-1, 1]),
         oh.make_tensor("axis0", I64, [1], [0])])
    model = onnx.shape_inference.infer_shapes(
        oh.make_model(graph, opset_imports=[oh.make_opsetid("", 16)], ir_version=IR_VERSION))
    out = check(model, {"levels": levels, "values": values, "zeros": np.zeros((6, 3), np.float32)})
    assert np.count_nonzero(out["merged"].any(axis=1)) == np.count_nonzero(levels == level)
