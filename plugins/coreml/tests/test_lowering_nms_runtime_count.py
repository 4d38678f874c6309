"""NonMaxSuppression over a box count the data decides, as torchvision's detection heads write it.

The boxes are those whose score passed a threshold (NonZero), cut to TopK(Min(20, count)), and
max_output_boxes_per_class is INT64_MAX. fold_static_values bounds the selection by the TopK's 20,
the lowering reads N at run time for its reshapes, and the interpreter's selection equals
onnxruntime's on several draws (different counts kept).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import onnxscript.optimizer
from onnx_cases import IR_VERSION, lower_and_run, run_onnxruntime

from edgebuild.graph.static_values import PASS

F, I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64


def _model(threshold: float) -> onnx.ModelProto:
    nodes = [
        oh.make_node("Greater", ["scores", "threshold"], ["keep"]), oh.make_node("NonZero", ["keep"], ["where"]),
        oh.make_node("Squeeze", ["where", "axis0"], ["kept_index"]),
        oh.make_node("Gather", ["scores", "kept_index"], ["kept"], axis=0),
        oh.make_node("Shape", ["kept"], ["count"]), oh.make_node("Concat", ["limit", "count"], ["both"], axis=0),
        oh.make_node("ReduceMin", ["both"], ["k"], keepdims=1),
        oh.make_node("TopK", ["kept", "k"], ["top", "top_index"]),
        oh.make_node("Gather", ["kept_index", "top_index"], ["chosen"], axis=0),
        oh.make_node("Gather", ["boxes", "chosen"], ["chosen_boxes"], axis=0),
        oh.make_node("Unsqueeze", ["chosen_boxes", "axis0"], ["batch_boxes"]),
        oh.make_node("Unsqueeze", ["top", "axes01"], ["batch_scores"]),
        oh.make_node("NonMaxSuppression", ["batch_boxes", "batch_scores", "max_out", "iou"], ["y"]),
    ]
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("scores", F, [50]),
                                       oh.make_tensor_value_info("boxes", F, [50, 4])], [onnx.ValueInfoProto(name="y")],
                          [oh.make_tensor("threshold", F, [], [threshold]), oh.make_tensor("axis0", I64, [1], [0]),
                           oh.make_tensor("axes01", I64, [2], [0, 1]), oh.make_tensor("limit", I64, [1], [20]),
                           oh.make_tensor("max_out", I64, [1], [2**63 - 1]), oh.make_tensor("iou", F, [1], [0.5])])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=IR_VERSION)


def test_selection_over_a_counted_box_list_matches_onnxruntime():
    for threshold in (0.3, 0.9):  # 20 boxes kept by the TopK; fewer than 20 passing the threshold
        source = _model(threshold)
        model = ir.serde.deserialize_model(source)
        onnxscript.optimizer.optimize_ir(model)
        assert PASS.apply(model) >= 1
        optimized = ir.serde.serialize_model(model)
        for seed in range(3):
            rng = np.random.default_rng(seed)
            corner = rng.uniform(0, 10, (50, 2)).astype(np.float32)
            feeds = {"scores": rng.uniform(0, 1, 50).astype(np.float32),
                     "boxes": np.concatenate([corner, corner + rng.uniform(1, 4, (50, 2)).astype(np.float32)], axis=1)}
            expected = run_onnxruntime(source, feeds)["y"]
            produced = lower_and_run(optimized, feeds)["y"]
            np.testing.assert_array_equal(produced, expected)


def test_an_unbounded_box_count_with_an_unbounded_limit_is_declined_by_name():
    import pytest
    from onnx_cases import lower

    from edgebuild_coreml.lowering.errors import DeclinedForm

    graph = oh.make_graph([oh.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou"], ["y"])], "g",
                          [oh.make_tensor_value_info("boxes", F, [1, "N", 4]),
                           oh.make_tensor_value_info("scores", F, [1, 1, "N"])], [onnx.ValueInfoProto(name="y")],
                          [oh.make_tensor("max_out", I64, [1], [2**63 - 1]), oh.make_tensor("iou", F, [1], [0.5])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=IR_VERSION)
    with pytest.raises(DeclinedForm, match="decided at run time with no static bound"):
        lower(model)


def test_an_if_giving_an_empty_constant_or_a_counted_list_matches_onnxruntime():
    """torchvision's batched_nms: ``if boxes.numel() == 0: return empty [0]`` else a list the data sizes; MIL's
    cond types its output from the true branch, so the run-time [N] must be the one it sees."""
    empty = oh.make_graph([oh.make_node("Constant", [], ["none"], value=oh.make_tensor("e", I64, [0], []))], "then", [],
                          [oh.make_tensor_value_info("none", I64, [0])])
    counted = oh.make_graph([oh.make_node("Greater", ["x", "half"], ["keep"]), oh.make_node("NonZero", ["keep"], ["where"]),
                             oh.make_node("Squeeze", ["where", "axis0"], ["kept"])], "else", [],
                            [oh.make_tensor_value_info("kept", I64, ["N"])])
    graph = oh.make_graph([oh.make_node("ReduceMax", ["x"], ["top"], keepdims=0),
                           oh.make_node("Less", ["top", "half"], ["nothing"]),
                           oh.make_node("If", ["nothing"], ["y"], then_branch=empty, else_branch=counted)], "g",
                          [oh.make_tensor_value_info("x", F, [12])], [onnx.ValueInfoProto(name="y")],
                          [oh.make_tensor("half", F, [], [0.5]), oh.make_tensor("axis0", I64, [1], [0])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=IR_VERSION)
    for scale in (1.0, 0.4):  # some above 0.5: the counted list; none: the empty constant
        feeds = {"x": (np.random.default_rng(0).uniform(0, 1, 12) * scale).astype(np.float32)}
        expected = run_onnxruntime(model, feeds)["y"]
        np.testing.assert_array_equal(lower_and_run(model, feeds)["y"], expected)
