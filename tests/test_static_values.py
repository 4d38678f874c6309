"""Compile-time operands that the pinned dims decide become constants in the optimise stage.

Each graph computes one operand a backend takes at compile time (TopK k, a Reshape target, Slice
bounds, Pad pads, Tile repeats, an Expand shape, Resize scales, a Range limit, ConstantOfShape,
Squeeze/Unsqueeze/Reduce axes, Split sizes, OneHot depth) from a dim of ``x [N, 8, 6]`` that is
static while N stays flexible, the form onnxscript's folding leaves (it folds a Shape only when
every dim is static). The optimised graph must hold the operand as a constant, give onnx's
reference evaluator's results for several N, and still hold it as a run-time value with the pass
switched off (so the pass is what folds it). What is not static stays dynamic: a count NonZero
decides, and the flexible dim itself.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper as oh, numpy_helper as onh
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from edgebuild.graph.frontend import OnnxFrontend
from edgebuild.graph.optimize import optimize
from edgebuild.graph.static_values import PASS, dim_upper_bound

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _i64(name, values):
    return onh.from_array(np.array(values, np.int64), name)


def _dim(index: int, out: str) -> list:
    """``out`` = x.shape[index] as a scalar (Shape -> Gather), as exporters write it."""
    return [oh.make_node("Shape", ["x"], [f"{out}_shape"]),
            oh.make_node("Gather", [f"{out}_shape", f"{out}_index"], [out], axis=0)]


def _vector(scalar: str, out: str) -> list:
    return [oh.make_node("Unsqueeze", [scalar, "axis0"], [out])]


# name -> (nodes computing the operand and using it, initializers, op type, operand index)
CASES = {
    "topk_k": ([*_dim(1, "d"), *_vector("d", "dv"), oh.make_node("Concat", ["five", "dv"], ["both"], axis=0),
                oh.make_node("ReduceMin", ["both"], ["k0"], keepdims=1),
                oh.make_node("TopK", ["x", "k0"], ["y", "y_indices"], axis=1)], [_i64("five", [5])], "TopK", 1),
    "reshape_target": ([*_dim(2, "d"), *_vector("d", "dv"), oh.make_node("Concat", ["minus1", "dv"], ["t"], axis=0),
                        oh.make_node("Reshape", ["x", "t"], ["y"])], [_i64("minus1", [-1])], "Reshape", 1),
    "slice_end": ([*_dim(1, "d"), oh.make_node("Sub", ["d", "one"], ["e"]), *_vector("e", "ev"),
                   oh.make_node("Slice", ["x", "start", "ev", "axes1"], ["y"])],
                  [_i64("one", 1), _i64("start", [1]), _i64("axes1", [1])], "Slice", 2),
    "pad_pads": ([*_dim(2, "d"), oh.make_node("Div", ["d", "three"], ["p"]), *_vector("p", "pv"),
                  oh.make_node("Concat", ["zeros4", "pv", "zero1"], ["pads"], axis=0),
                  oh.make_node("Pad", ["x", "pads"], ["y"])], [_i64("three", 3), _i64("zeros4", [0, 0, 0, 0]),
                                                           _i64("zero1", [0])], "Pad", 1),
    "tile_repeats": ([*_dim(2, "d"), oh.make_node("Div", ["d", "three"], ["r"]), *_vector("r", "rv"),
                      oh.make_node("Concat", ["one1", "rv", "one1"], ["reps"], axis=0),
                      oh.make_node("Tile", ["x", "reps"], ["y"])], [_i64("one1", [1]), _i64("three", 3)], "Tile", 1),
    "expand_shape": ([*_dim(1, "d"), *_dim(2, "e"), *_vector("d", "dv"), *_vector("e", "ev"),
                      oh.make_node("Concat", ["dv", "ev"], ["s"], axis=0), oh.make_node("Expand", ["row", "s"], ["ex"]),
                      oh.make_node("Add", ["x", "ex"], ["y"])],
                     [onh.from_array(np.arange(6, dtype=np.float32).reshape(1, 6), "row")], "Expand", 1),
    "resize_scales": ([*_dim(2, "d"), oh.make_node("Cast", ["d"], ["df"], to=F), oh.make_node("Div", ["twelve", "df"], ["sc"]),
                       oh.make_node("Unsqueeze", ["sc", "axis0"], ["scv"]),
                       oh.make_node("Concat", ["ones_f", "scv"], ["scales"], axis=0),
                       oh.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")],
                      [onh.from_array(np.array(12.0, np.float32), "twelve"),
                       onh.from_array(np.array([1.0, 1.0], np.float32), "ones_f")], "Resize", 2),
    "range_limit": ([*_dim(1, "d"), oh.make_node("Range", ["zero", "d", "one"], ["positions"]),
                     oh.make_node("Cast", ["positions"], ["pf"], to=F), oh.make_node("Unsqueeze", ["pf", "axis1"], ["pc"]),
                     oh.make_node("Add", ["x", "pc"], ["y"])], [_i64("zero", 0), _i64("one", 1), _i64("axis1", [1])],
                    "Range", 1),
    "constant_of_shape": ([oh.make_node("Shape", ["x"], ["full"]), oh.make_node("Slice", ["full", "one1", "three1"], ["s"]),
                           oh.make_node("ConstantOfShape", ["s"], ["c"],
                                                                                     value=onh.from_array(np.array([2.0], np.float32))),
                           oh.make_node("Mul", ["x", "c"], ["y"])], [_i64("one1", [1]), _i64("three1", [3])],
                          "ConstantOfShape", 0),
    "unsqueeze_axes": ([*_dim(2, "d"), oh.make_node("Sub", ["d", "six"], ["a"]), *_vector("a", "av"),
                        oh.make_node("Unsqueeze", ["x", "av"], ["y"])], [_i64("six", 6)], "Unsqueeze", 1),
    "reduce_axes": ([*_dim(2, "d"), oh.make_node("Sub", ["d", "five_s"], ["a"]), *_vector("a", "av"),
                     oh.make_node("ReduceSum", ["x", "av"], ["y"], keepdims=1)], [_i64("five_s", 5)], "ReduceSum", 1),
    "split_sizes": ([*_dim(1, "d"), oh.make_node("Sub", ["d", "two"], ["rest"]), *_vector("rest", "rv"),
                     oh.make_node("Concat", ["two1", "rv"], ["sizes"], axis=0),
                     oh.make_node("Split", ["x", "sizes"], ["y", "y_rest"], axis=1)],
                    [_i64("two", 2), _i64("two1", [2])], "Split", 1),
    "onehot_depth": ([*_dim(1, "d"), oh.make_node("OneHot", ["labels", "d", "off_on"], ["y"], axis=-1)],
                     [onh.from_array(np.array([0.0, 1.0], np.float32), "off_on")], "OneHot", 1),
}


def _case_model(name: str) -> onnx.ModelProto:
    nodes, inits, op_type, _ = CASES[name]
    index = {"topk_k": 1, "slice_end": 1, "range_limit": 1, "split_sizes": 1, "onehot_depth": 1,
             "expand_shape": 1}.get(name, 2)
    inits = [*inits, _i64("d_index", index), _i64("e_index", 2)]
    extra = [oh.make_tensor_value_info("labels", I64, [4])] if name == "onehot_depth" else []
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", F, ["N", 8, 6]), *extra],
                          [onnx.ValueInfoProto(name="y")], [*inits, _i64("axis0", [0])])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)


def _optimized(model: onnx.ModelProto, tmp_path, inputs: dict, passes=None) -> onnx.ModelProto:
    tmp_path.mkdir(parents=True, exist_ok=True)
    onnx.save(model, tmp_path / "source.onnx")
    OnnxFrontend().import_model(tmp_path / "source.onnx", inputs, tmp_path / "imported")
    optimize(tmp_path / "imported" / "model.onnx", tmp_path / "optimized", passes=passes)
    return onnx.load(str(tmp_path / "optimized" / "model.onnx"))


def _operand_is_constant(model: onnx.ModelProto, op_type: str, index: int) -> bool:
    """Every ``op_type`` node reads input ``index`` from a constant (or none is left: it was folded whole)."""
    constants = {i.name for i in model.graph.initializer}
    constants |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    return all(n.input[index] in constants for n in model.graph.node if n.op_type == op_type)


FLEXIBLE = {"x": {"shape": ["N", 8, 6]}}


def _folded_by_onnxscript_then_the_pass(model: onnx.ModelProto, tmp_path, inputs: dict):
    """(after onnxscript's optimizer, after it and the pass): the optimise stage's two steps that matter
    here, without its fusion passes."""
    import onnxscript.optimizer

    tmp_path.mkdir(parents=True, exist_ok=True)
    onnx.save(model, tmp_path / "source.onnx")
    OnnxFrontend().import_model(tmp_path / "source.onnx", inputs, tmp_path / "imported")
    pinned = ir.load(tmp_path / "imported" / "model.onnx")
    onnxscript.optimizer.optimize_ir(pinned)
    before = ir.serde.serialize_model(pinned)
    assert PASS.apply(pinned) > 0
    return before, ir.serde.serialize_model(pinned)


@pytest.mark.parametrize("name", sorted(CASES))
def test_operand_of_a_partly_static_shape_folds(name, tmp_path):
    _, _, op_type, index = CASES[name]
    source = _case_model(name)
    kept, optimized = _folded_by_onnxscript_then_the_pass(source, tmp_path, FLEXIBLE)
    assert not _operand_is_constant(kept, op_type, index), "onnxscript folds this form itself: the case tests nothing"
    assert _operand_is_constant(optimized, op_type, index), f"{op_type} input {index} is still computed"
    for n in (1, 3):
        feeds = {"x": np.random.default_rng(n).standard_normal((n, 8, 6)).astype(np.float32)}
        if name == "onehot_depth":
            feeds["labels"] = np.array([0, 7, 3, 5], np.int64)
        expected = ReferenceEvaluator(source).run(None, feeds)
        produced = ReferenceEvaluator(optimized).run(None, feeds)
        for want, got in zip(expected, produced):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_the_optimise_stage_runs_the_pass(tmp_path):
    source = _case_model("topk_k")
    assert _operand_is_constant(_optimized(source, tmp_path / "on", FLEXIBLE), "TopK", 1)
    assert not _operand_is_constant(_optimized(source, tmp_path / "off", FLEXIBLE, passes={"fold_static_values": False}),
                                    "TopK", 1)


def test_a_count_nonzero_decides_stays_computed(tmp_path):
    """TopK(kept, Min(5, count of kept)): the count is data (the detection-head form), never folded."""
    nodes = [oh.make_node("Greater", ["x", "half"], ["mask"]), oh.make_node("NonZero", ["mask"], ["where"]),
             oh.make_node("Shape", ["where"], ["s"]), oh.make_node("Gather", ["s", "one_index"], ["count"], axis=0),
             oh.make_node("Unsqueeze", ["count", "axis0"], ["cv"]), oh.make_node("Concat", ["five", "cv"], ["both"], axis=0),
             oh.make_node("ReduceMin", ["both"], ["k"], keepdims=1),
             oh.make_node("Cast", ["where"], ["wf"], to=F), oh.make_node("ReduceSum", ["wf", "axis0"], ["scores"], keepdims=0),
             oh.make_node("TopK", ["scores", "k"], ["y", "y_indices"])]
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", F, [8, 6])], [onnx.ValueInfoProto(name="y")],
                          [onh.from_array(np.array(0.5, np.float32), "half"), _i64("one_index", 1), _i64("axis0", [0]),
                           _i64("five", [5])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)
    optimized = _optimized(model, tmp_path, {"x": {"shape": [8, 6]}})
    assert not _operand_is_constant(optimized, "TopK", 1)


def test_the_flexible_dim_itself_stays_computed(tmp_path):
    nodes = [*_dim(0, "d"), *_vector("d", "dv"), oh.make_node("Concat", ["dv", "minus1"], ["t"], axis=0),
             oh.make_node("Reshape", ["x", "t"], ["y"])]
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", F, ["N", 8, 6])], [onnx.ValueInfoProto(name="y")],
                          [_i64("d_index", 0), _i64("axis0", [0]), _i64("minus1", [-1])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)
    optimized = _optimized(model, tmp_path, FLEXIBLE)
    assert not _operand_is_constant(optimized, "Reshape", 1)


def _branch(name, op, out):
    return oh.make_graph([oh.make_node(op, ["x"], [out])], name, [], [oh.make_tensor_value_info(out, F, None)])


def test_shape_of_an_if_whose_branches_agree(tmp_path):
    """The If's output is untyped (its branches are typed only inside); both give x's shape."""
    nodes = [oh.make_node("ReduceSum", ["x"], ["total"], keepdims=0), oh.make_node("Greater", ["total", "zero_f"], ["p"]),
             oh.make_node("If", ["p"], ["z"], then_branch=_branch("then", "Relu", "a"),
                          else_branch=_branch("else", "Neg", "b")),
             *[oh.make_node("Shape", ["z"], ["zs"]), oh.make_node("Gather", ["zs", "one_index"], ["d"], axis=0)],
             *_vector("d", "k"), oh.make_node("TopK", ["z", "k"], ["y", "y_indices"], axis=1)]
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", F, [2, 8])], [onnx.ValueInfoProto(name="y")],
                          [onh.from_array(np.array(0.0, np.float32), "zero_f"), _i64("one_index", 1), _i64("axis0", [0])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)
    optimized = _optimized(model, tmp_path, {"x": {"shape": [2, 8]}})
    assert _operand_is_constant(optimized, "TopK", 1)
    for sign in (1.0, -1.0):
        feeds = {"x": sign * np.abs(np.random.default_rng(0).standard_normal((2, 8))).astype(np.float32)}
        np.testing.assert_allclose(ReferenceEvaluator(optimized).run(None, feeds)[0],
                                   ReferenceEvaluator(model).run(None, feeds)[0], rtol=1e-6)


class Gelu(OpRun):  # onnx's reference evaluator finds a custom op by its class name
    op_domain = "com.microsoft"

    def _run(self, x, approximate=None):
        from math import erf

        return ((0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))).astype(x.dtype),)


def test_shape_through_a_shape_preserving_custom_op(tmp_path):
    """com.microsoft::Gelu has no onnx schema, so no inference types its output; it keeps x's shape."""
    nodes = [oh.make_node("Gelu", ["x"], ["g"], domain="com.microsoft"), *[oh.make_node("Shape", ["g"], ["gs"]),
             oh.make_node("Gather", ["gs", "two_index"], ["d"], axis=0)], *_vector("d", "dv"),
             oh.make_node("Concat", ["minus1", "dv"], ["t"], axis=0), oh.make_node("Reshape", ["g", "t"], ["y"])]
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", F, ["N", 8, 6])], [onnx.ValueInfoProto(name="y")],
                          [_i64("two_index", 2), _i64("axis0", [0]), _i64("minus1", [-1])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid("com.microsoft", 1)],
                          ir_version=10)
    optimized = _optimized(model, tmp_path, {"x": {"shape": [2, 8, 6]}})
    assert _operand_is_constant(optimized, "Reshape", 1)
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 8, 6)).astype(np.float32)}
    np.testing.assert_allclose(ReferenceEvaluator(optimized, new_ops=[Gelu]).run(None, feeds)[0],
                               ReferenceEvaluator(model, new_ops=[Gelu]).run(None, feeds)[0], rtol=1e-6)


def test_the_pass_reports_nothing_on_a_graph_without_such_values():
    graph = oh.make_graph([oh.make_node("Relu", ["x"], ["y"])], "g", [oh.make_tensor_value_info("x", F, [2, 3])],
                          [oh.make_tensor_value_info("y", F, [2, 3])])
    model = ir.serde.deserialize_model(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10))
    assert PASS.apply(model) == 0


def test_shape_of_a_loop_carried_value_stays_computed():
    """A Loop body's input may change shape between iterations whatever it is typed: its Shape is not folded."""
    body = oh.make_graph([oh.make_node("Shape", ["state"], ["s"]), oh.make_node("Gather", ["s", "one_index"], ["d"], axis=0),
                          oh.make_node("Unsqueeze", ["d", "axis0"], ["dv"]),
                          oh.make_node("Concat", ["state", "state"], ["grown"], axis=1),
                          oh.make_node("Identity", ["cond_in"], ["cond_out"]), oh.make_node("Identity", ["dv"], ["width"])],
                         "body", [oh.make_tensor_value_info("i", I64, []), oh.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                                  oh.make_tensor_value_info("state", F, [2, 3])],
                         [oh.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                          oh.make_tensor_value_info("grown", F, [2, None]), oh.make_tensor_value_info("width", I64, [1])],
                         [_i64("one_index", 1), _i64("axis0", [0])])
    graph = oh.make_graph([oh.make_node("Loop", ["trips", "go", "x"], ["final", "widths"], body=body)], "g",
                          [oh.make_tensor_value_info("x", F, [2, 3])], [onnx.ValueInfoProto(name="widths")],
                          [_i64("trips", 3), onh.from_array(np.array(True), "go")])
    model = ir.serde.deserialize_model(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10))
    PASS.apply(model)
    rewritten = ir.serde.serialize_model(model)
    widths = ReferenceEvaluator(rewritten).run(None, {"x": np.zeros((2, 3), np.float32)})[0]
    np.testing.assert_array_equal(widths.reshape(-1), [3, 6, 12])


def test_a_reshape_target_known_but_for_a_count_infers_it(tmp_path):
    """Boxes kept by a threshold (Compress: a count the data decides) reshaped by Concat(Shape(kept)[0], 4), the
    form of torchvision's RetinaNet and FCOS heads: the target becomes [-1, 4], so the 4 is static after it."""
    nodes = [oh.make_node("ReduceMax", ["x", "axis1"], ["score"], keepdims=0),
             oh.make_node("Greater", ["score", "half"], ["keep"]),
             oh.make_node("Compress", ["x", "keep"], ["kept"], axis=0),
             oh.make_node("Shape", ["kept"], ["s"], end=1), oh.make_node("Concat", ["s", "two_two"], ["t1"], axis=0),
             oh.make_node("Reshape", ["kept", "t1"], ["pairs"]),
             oh.make_node("Shape", ["pairs"], ["s2"], end=1), oh.make_node("Concat", ["s2", "four"], ["t2"], axis=0),
             oh.make_node("Reshape", ["pairs", "t2"], ["y"])]
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", F, [8, 4])], [onnx.ValueInfoProto(name="y")],
                          [_i64("axis1", [1]), onh.from_array(np.array(0.5, np.float32), "half"),
                           _i64("two_two", [2, 2]), _i64("four", [4])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)
    optimized = _optimized(model, tmp_path, {"x": {"shape": [8, 4]}})
    targets = {i.name: onh.to_array(i) for i in optimized.graph.initializer}
    reshapes = [n for n in optimized.graph.node if n.op_type == "Reshape"]
    assert reshapes and all(n.input[1] in targets and -1 in targets[n.input[1]] for n in reshapes)
    shapes = {v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
              for v in [*optimized.graph.value_info, *optimized.graph.output]}
    assert shapes["y"][-1] == 4
    for seed in (0, 1):
        feeds = {"x": np.random.default_rng(seed).uniform(0, 1, (8, 4)).astype(np.float32)}
        np.testing.assert_array_equal(ReferenceEvaluator(optimized).run(None, feeds)[0],
                                      ReferenceEvaluator(model).run(None, feeds)[0])


def _nms_of_the_top_scores(limit: int = 20) -> onnx.ModelProto:
    """Scores above 0.3 (NonZero), their TopK(Min(limit, count)), those boxes into NonMaxSuppression with
    max_output_boxes_per_class = INT64_MAX, as torchvision's detection heads write it."""
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
                          [onh.from_array(np.array(0.3, np.float32), "threshold"), _i64("axis0", [0]),
                           _i64("axes01", [0, 1]), _i64("limit", [limit]), _i64("max_out", [2**63 - 1]),
                           onh.from_array(np.array([0.5], np.float32), "iou")])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)


def _detections(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    corner = rng.uniform(0, 10, (50, 2)).astype(np.float32)
    return {"scores": rng.uniform(0, 1, 50).astype(np.float32),
            "boxes": np.concatenate([corner, corner + rng.uniform(1, 4, (50, 2)).astype(np.float32)], axis=1)}


def test_nms_selects_at_most_the_bound_of_its_box_count():
    """max_output_boxes_per_class INT64_MAX becomes 20, the TopK's limit: NMS cannot select more boxes than it
    has, so the selection is the same, and a backend preallocating it gets a size it can hold."""
    import onnxscript.optimizer

    source = _nms_of_the_top_scores()
    model = ir.serde.deserialize_model(source)
    onnxscript.optimizer.optimize_ir(model)
    nms = next(n for n in model.graph if n.op_type == "NonMaxSuppression")
    assert dim_upper_bound(nms.inputs[0], 1) == 20
    assert PASS.apply(model) >= 1
    rewritten = ir.serde.serialize_model(model)
    limits = {i.name: onh.to_array(i) for i in rewritten.graph.initializer}
    [node] = [n for n in rewritten.graph.node if n.op_type == "NonMaxSuppression"]
    assert limits[node.input[2]].tolist() == [20]
    for seed in range(3):
        np.testing.assert_array_equal(ReferenceEvaluator(rewritten).run(None, _detections(seed))[0],
                                      ReferenceEvaluator(source).run(None, _detections(seed))[0])


def test_bound_through_the_labels_torchvision_builds_for_batched_nms():
    """labels = Concat(ConstantOfShape(Shape(top_per_class)), ...): each at most its TopK's k, the Concat the sum;
    the axes of an Unsqueeze left as a Constant node (a branch's) count as constants."""
    nodes = [oh.make_node("TopK", ["scores", "k"], ["top", "top_index"]), oh.make_node("Shape", ["top"], ["n"]),
             oh.make_node("ConstantOfShape", ["n"], ["labels"], value=onh.from_array(np.array([1], np.int64))),
             oh.make_node("Concat", ["labels", "labels"], ["all_labels"], axis=0),
             oh.make_node("Constant", [], ["axes"], value=onh.from_array(np.array([1], np.int64))),
             oh.make_node("Unsqueeze", ["all_labels", "axes"], ["y"])]
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("scores", F, ["N"]),
                                       oh.make_tensor_value_info("k", I64, [1])], [onnx.ValueInfoProto(name="y")])
    typed = onnx.shape_inference.infer_shapes(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10))
    model = ir.serde.deserialize_model(typed)
    values = {o.name: o for node in model.graph for o in node.outputs}
    assert dim_upper_bound(values["y"], 0) is None  # k is run-time data: nothing bounds it
    model.graph.node(0).replace_input_with(1, _bounded_k(model.graph))
    assert dim_upper_bound(values["labels"], 0) == 7 and dim_upper_bound(values["y"], 0) == 14


def _bounded_k(graph: ir.Graph) -> ir.Value:
    """Min(7, k): the detection heads' k."""
    seven = ir.Value(name="seven", shape=ir.Shape([1]), type=ir.TensorType(ir.DataType.INT64),
                     const_value=ir.tensor(np.array([7], np.int64), name="seven"))
    graph.register_initializer(seven)
    node = ir.node("Min", [seven, graph.inputs[1]], name="bounded_k")
    node.outputs[0].shape, node.outputs[0].dtype = ir.Shape([1]), ir.DataType.INT64
    graph.insert_before(graph.node(0), node)
    return node.outputs[0]


def _two_stage_detector() -> onnx.ModelProto:
    """A two-stage detector's post-processing, as torchvision's TorchScript export writes it: the proposals
    scoring at least 0.3 (NonZero, Transpose, Split, Squeeze), a first NMS, its kept boxes out of an If
    (none when there is no proposal), and a second NMS inside an If branch whose Unsqueeze reads an outer
    constant, so onnx's inference leaves the branch's values untyped. Both limits are INT64_MAX."""

    def nms_of(boxes: str, scores: str, out: str, prefix: str) -> list:
        return [oh.make_node("Unsqueeze", [boxes, "axis0"], [f"{prefix}_boxes"]),
                oh.make_node("Unsqueeze", [scores, "axes01"], [f"{prefix}_scores"]),
                oh.make_node("NonMaxSuppression", [f"{prefix}_boxes", f"{prefix}_scores", "max_out", "iou"],
                             [f"{prefix}_selected"]),
                oh.make_node("Gather", [f"{prefix}_selected", "two"], [out], axis=1)]

    def branches(prefix: str, boxes: str, scores: str, out: str) -> dict:
        empty = oh.make_graph([oh.make_node("Constant", [], [f"{prefix}_none"],
                                            value=onh.from_array(np.zeros(0, np.int64)))],
                              f"{prefix}_empty", [], [oh.make_tensor_value_info(f"{prefix}_none", I64, [0])])
        selecting = oh.make_graph(nms_of(boxes, scores, f"{prefix}_keep", prefix), f"{prefix}_nms", [],
                                  [onnx.ValueInfoProto(name=f"{prefix}_keep")])
        return {"then_branch": empty, "else_branch": selecting}

    nodes = [
        oh.make_node("GreaterOrEqual", ["scores", "threshold"], ["passed"]), oh.make_node("NonZero", ["passed"], ["where"]),
        oh.make_node("Transpose", ["where"], ["where_t"], perm=[1, 0]),
        oh.make_node("Split", ["where_t", "one1"], ["where_col"], axis=1),
        oh.make_node("Squeeze", ["where_col", "one1"], ["index"]),
        oh.make_node("Gather", ["boxes", "index"], ["proposals"], axis=0),
        oh.make_node("Gather", ["scores", "index"], ["proposal_scores"], axis=0),
        oh.make_node("Size", ["proposal_scores"], ["count"]), oh.make_node("Equal", ["count", "zero"], ["none"]),
        oh.make_node("If", ["none"], ["keep"], **branches("rpn", "proposals", "proposal_scores", "keep")),
        oh.make_node("Gather", ["proposals", "keep"], ["refined"], axis=0),
        oh.make_node("Gather", ["proposal_scores", "keep"], ["refined_scores"], axis=0),
        oh.make_node("Size", ["refined_scores"], ["refined_count"]),
        oh.make_node("Equal", ["refined_count", "zero"], ["no_refined"]),
        oh.make_node("If", ["no_refined"], ["y"], **branches("head", "refined", "refined_scores", "y")),
    ]
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("scores", F, [50]),
                                       oh.make_tensor_value_info("boxes", F, [50, 4])], [onnx.ValueInfoProto(name="y")],
                          [onh.from_array(np.array(0.3, np.float32), "threshold"), _i64("axis0", [0]),
                           _i64("axes01", [0, 1]), _i64("one1", [1]), _i64("two", 2), _i64("zero", 0),
                           _i64("max_out", [2**63 - 1]), onh.from_array(np.array([0.5], np.float32), "iou")])
    return onnx.shape_inference.infer_shapes(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10))


def test_both_nms_of_a_two_stage_detector_are_bounded():
    """Each limit becomes 50, the proposals' bound, read through Split, GreaterOrEqual, the If that gives
    the first NMS's kept indices (the larger of its branches) and the untyped values of the second's branch."""
    source = _two_stage_detector()
    model = ir.serde.deserialize_model(source)
    nms = [n for g in (b.value for n in model.graph if n.op_type == "If" for b in n.attributes.values())
           for n in g if n.op_type == "NonMaxSuppression"]
    assert [dim_upper_bound(n.inputs[0], 1) for n in nms] == [50, 50]
    assert PASS.apply(model) >= 2
    assert [int(n.inputs[2].const_value.numpy()[0]) for n in nms] == [50, 50]
    rewritten = ir.serde.serialize_model(model)
    for seed in range(3):
        np.testing.assert_array_equal(ReferenceEvaluator(rewritten).run(None, _detections(seed))[0],
                                      ReferenceEvaluator(source).run(None, _detections(seed))[0])
