"""The MIL interpreter's non_maximum_suppression (iOS15 and iOS17 layouts) against onnxruntime's
NonMaxSuppression on the same boxes, and its padding and per-class rules by hand.

Programs are built with coremltools' Builder, saved as .mlpackage, read back and interpreted.
"""

from __future__ import annotations

import numpy as np
import pytest

ct = pytest.importorskip("coremltools")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from coremltools.converters.mil import Builder as mb  # noqa: E402
from interpreter_programs import roundtrip, spec  # noqa: E402
from onnx import helper as oh  # noqa: E402


def _corner_boxes(count, seed):
    rng = np.random.default_rng(seed)
    low = rng.uniform(0, 8, (count, 2))
    return np.concatenate([low, low + rng.uniform(0.5, 4, (count, 2))], axis=1).astype(np.float32)  # y1 x1 y2 x2


def _centre_size(corners):
    y1, x1, y2, x2 = corners.T
    return np.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], axis=1).astype(np.float32)


def _onnxruntime_nms(corners, scores, max_boxes, iou, score_threshold):
    node = oh.make_node("NonMaxSuppression", ["boxes", "scores", "max", "iou", "score"], ["selected"])
    graph = oh.make_graph(
        [node], "nms",
        [oh.make_tensor_value_info("boxes", onnx.TensorProto.FLOAT, [1, len(corners), 4]),
         oh.make_tensor_value_info("scores", onnx.TensorProto.FLOAT, [1, 1, len(corners)])],
        [oh.make_tensor_value_info("selected", onnx.TensorProto.INT64, None)],
        [oh.make_tensor("max", onnx.TensorProto.INT64, [1], [max_boxes]),
         oh.make_tensor("iou", onnx.TensorProto.FLOAT, [1], [iou]),
         oh.make_tensor("score", onnx.TensorProto.FLOAT, [1], [score_threshold])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 11)], ir_version=10)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"boxes": corners[None], "scores": scores[None, None]})[0][:, 2]


def test_ios17_matches_onnxruntime(tmp_path):
    corners = _corner_boxes(40, seed=3)
    scores = np.random.default_rng(4).uniform(0, 1, 40).astype(np.float32)
    boxes = _centre_size(corners)

    @mb.program(input_specs=[spec((1, 4, 40)), spec((1, 1, 40))], opset_version=ct.target.iOS17)
    def prog(boxes, scores):
        out_boxes, _, indices = mb.non_maximum_suppression(
            boxes=boxes, scores=scores, iou_threshold=np.float32(0.3), max_boxes=np.int32(40))
        return mb.identity(x=indices, name="indices"), mb.identity(x=out_boxes, name="boxes_out")

    o = roundtrip(prog, tmp_path, {"boxes": boxes.T[None], "scores": scores[None, None]})
    expected = _onnxruntime_nms(corners, scores, 40, 0.3, -1.0)
    kept = o["indices"][0]
    np.testing.assert_array_equal(kept[: len(expected)], expected)
    assert (kept[len(expected):] == -1).all()  # unfilled slots
    np.testing.assert_allclose(o["boxes_out"][0, :, : len(expected)], boxes[expected].T, rtol=1e-6)


def test_ios15_score_threshold_and_count(tmp_path):
    corners = _corner_boxes(30, seed=5)
    scores = np.random.default_rng(6).uniform(0, 1, 30).astype(np.float32)

    @mb.program(input_specs=[spec((1, 30, 4)), spec((1, 30, 1))], opset_version=ct.target.iOS15)
    def prog(boxes, scores):
        _, _, indices, count = mb.non_maximum_suppression(
            boxes=boxes, scores=scores, iou_threshold=np.float32(0.5), score_threshold=np.float32(0.4),
            max_boxes=np.int32(5))
        return mb.identity(x=indices, name="indices"), mb.identity(x=count, name="count")

    o = roundtrip(prog, tmp_path, {"boxes": _centre_size(corners)[None], "scores": scores[None, :, None]},
                  target=ct.target.iOS15)
    expected = _onnxruntime_nms(corners, scores, 5, 0.5, 0.4)
    assert int(o["count"][0]) == len(expected)
    np.testing.assert_array_equal(o["indices"][0, : len(expected)], expected)


def test_per_class_suppression_and_ties(tmp_path):
    # Boxes 0 and 1 overlap fully; 2 is far away. Equal scores keep the earlier box.
    boxes = np.array([[[1, 1, 2, 2], [1, 1, 2, 2], [9, 9, 2, 2]]], dtype=np.float32).transpose(0, 2, 1)
    scores = np.array([[[0.9, 0.1], [0.2, 0.9], [0.5, 0.4]]], dtype=np.float32).transpose(0, 2, 1)

    @mb.program(input_specs=[spec((1, 4, 3)), spec((1, 2, 3))], opset_version=ct.target.iOS17)
    def prog(boxes, scores):
        per_class = mb.non_maximum_suppression(boxes=boxes, scores=scores, iou_threshold=np.float32(0.5),
                                               max_boxes=np.int32(3), per_class_suppression=True)[2]
        shared = mb.non_maximum_suppression(boxes=boxes, scores=scores, iou_threshold=np.float32(0.5),
                                            max_boxes=np.int32(3))[2]
        return mb.identity(x=per_class, name="per_class"), mb.identity(x=shared, name="shared")

    o = roundtrip(prog, tmp_path, {"boxes": boxes, "scores": scores})
    np.testing.assert_array_equal(o["per_class"][0], [0, 1, 2])  # 0 and 1 differ in class
    np.testing.assert_array_equal(o["shared"][0], [0, 2, -1])  # the earlier of the tied boxes wins
