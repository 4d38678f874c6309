"""Lowerings fixed against the ONNX node conformance suite: quantisation, CRD SpaceToDepth,
Resize align_corners with fractional scales, LpNormalization of zero slices, integer
MaxPool, training-mode BatchNormalization, Einsum ellipses/diagonals, runtime Slice bounds
(and a Loop slicing at its iteration number), and gather-based GridSample.

Each case lowers a small ONNX model, runs it in the MIL interpreter and compares with
onnxruntime, or with onnx's reference evaluator where onnxruntime lacks the op or variant.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx.reference import ReferenceEvaluator
from onnx_cases import IR_VERSION, assert_matches, check, check_op, feeds_of, lower_and_run, rand, single_node_model


def check_reference(model, inputs, *, initializers=(), rtol=1e-5, atol=1e-6):
    """Lower and run ``model``; compare every output with onnx's reference evaluator."""
    feeds = feeds_of(inputs, initializers)
    expected = ReferenceEvaluator(model).run(None, feeds)
    names = [o.name for o in model.graph.output]
    actual = lower_and_run(model, feeds)
    for name, reference in zip(names, expected):
        assert_matches(actual[name], reference, rtol=rtol, atol=atol, name=name)
    return actual


# -- quantisation ------------------------------------------------------------------------
def test_quantize_per_tensor_ignores_axis_on_rank_1():
    x = np.array([0, 2, 3, 1000, -254, -1000], np.float32)
    inputs = {"x": x, "scale": np.float32(2.0), "zero": np.uint8(128)}
    check_op("QuantizeLinear", inputs, opset=19, initializers=("scale", "zero"))


def test_quantize_to_int16():
    x = rand(6, seed=3, low=-70000, high=70000)
    inputs = {"x": x, "scale": np.float32(1.7), "zero": np.int16(-3)}
    check_op("QuantizeLinear", inputs, opset=21, initializers=("scale", "zero"))


def test_quantize_with_runtime_scale_and_zero_point():
    inputs = {"x": rand(2, 5, seed=4, low=-3, high=3), "scale": np.float32(0.02), "zero": np.uint8(100)}
    check_op("QuantizeLinear", inputs, opset=19)


def test_dequantize_per_tensor_rank_1():
    inputs = {"x": np.array([0, 3, 128, 255], np.uint8), "scale": np.float32(2.0), "zero": np.uint8(128)}
    check_op("DequantizeLinear", inputs, opset=19, initializers=("scale", "zero"))


def test_dequantize_runtime_per_axis_scale():
    inputs = {"x": np.arange(-6, 6, dtype=np.int8).reshape(3, 4), "scale": np.array([0.5, 1.5, 2.0], np.float32)}
    check_op("DequantizeLinear", inputs, attrs={"axis": 0}, opset=19)


@pytest.mark.parametrize("low,high", [(-3.0, 5.0), (0.5, 4.0), (-6.0, -1.0)], ids=["mixed", "positive", "negative"])
def test_dynamic_quantize_linear(low, high):
    x = rand(3, 7, seed=5, low=low, high=high)
    check_op("DynamicQuantizeLinear", {"x": x}, outputs=["y", "scale", "zero"], opset=11)


# -- layout, resize, normalisation, pooling -----------------------------------------------
def test_space_to_depth_crd():
    x = rand(1, 2, 4, 6, seed=6)
    model = single_node_model("SpaceToDepth", {"x": x}, attrs={"blocksize": 2, "mode": "CRD"}, opset=25)
    check_reference(model, {"x": x})


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_align_corners_with_fractional_scale(mode):
    x = rand(1, 1, 4, 4, seed=7)
    scales = np.array([1, 1, 0.6, 0.6], np.float32)
    model = single_node_model("Resize", {"x": x, "roi": None, "scales": scales}, opset=19,
                              attrs={"mode": mode, "coordinate_transformation_mode": "align_corners"},
                              initializers=("scales",))
    check_reference(model, {"x": x, "roi": None, "scales": scales}, initializers=("scales",), rtol=1e-4, atol=1e-5)


def test_lp_normalization_of_zero_slice_is_zero():
    x = np.array([[0.0, 3.0, 0.0], [0.0, 4.0, 1.0]], np.float32)
    out = check_op("LpNormalization", {"x": x}, attrs={"axis": 0, "p": 2}, opset=1)
    assert np.isfinite(out["y"]).all()


def test_max_pool_uint8():
    x = np.random.default_rng(8).integers(0, 256, (1, 2, 5, 5)).astype(np.uint8)
    check_op("MaxPool", {"x": x}, attrs={"kernel_shape": [2, 2], "strides": [1, 2]}, opset=12)


@pytest.mark.parametrize("epsilon,momentum", [(1e-5, 0.9), (1e-2, 0.6)])
def test_batch_norm_training_mode(epsilon, momentum):
    inputs = {"x": rand(2, 3, 4, 5, seed=9), "scale": rand(3, seed=10), "bias": rand(3, seed=11),
              "mean": rand(3, seed=12), "var": rand(3, seed=13, low=0.1, high=1.0)}
    model = single_node_model("BatchNormalization", inputs, outputs=["y", "running_mean", "running_var"], opset=15,
                              attrs={"training_mode": 1, "epsilon": epsilon, "momentum": momentum})
    check_reference(model, inputs, rtol=1e-4, atol=1e-5)


# -- einsum ------------------------------------------------------------------------------
@pytest.mark.parametrize("equation,shapes", [
    ("...ii->...i", [(3, 5, 5)]),
    ("i,i", [(5,), (5,)]),
    ("ii", [(4, 4)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("...ij,...jk", [(2, 3, 4), (4, 2)]),
    ("bii,bj->bij", [(2, 3, 3), (2, 4)]),
    ("ij->", [(3, 4)]),
])
def test_einsum(equation, shapes):
    inputs = {f"x{k}": rand(*shape, seed=20 + k) for k, shape in enumerate(shapes)}
    model = single_node_model("Einsum", inputs, attrs={"equation": equation}, opset=12)
    out = lower_and_run(model, inputs)
    assert_matches(out["y"], np.einsum(equation, *inputs.values()), rtol=1e-4, atol=1e-5)


# -- slice with runtime bounds, and a loop slicing at its iteration -----------------------
@pytest.mark.parametrize("starts,ends", [([1, -3], [3, 100]), ([-100, 0], [-1, 2]), ([4, 1], [2, 4])])
def test_slice_runtime_starts_and_ends(starts, ends):
    inputs = {"x": rand(4, 5, seed=30), "starts": np.array(starts, np.int64), "ends": np.array(ends, np.int64),
              "axes": np.array([0, 1], np.int64)}
    check_op("Slice", inputs, opset=13, initializers=("axes",))


def test_slice_runtime_starts_refuse_negative_steps():
    from edgebuild_coreml.lowering.errors import LoweringError

    inputs = {"x": rand(4, 5, seed=31), "starts": np.array([3], np.int64), "ends": np.array([0], np.int64),
              "axes": np.array([1], np.int64), "steps": np.array([-1], np.int64)}
    model = single_node_model("Slice", inputs, opset=13, initializers=("axes", "steps"))
    with pytest.raises(LoweringError, match="positive steps"):
        lower_and_run(model, feeds_of(inputs, ("axes", "steps")))


def test_loop_slicing_at_iteration_number():
    """Scan rows come from Slice(x, [i], [i + 1]); MIL cannot infer that shape, the body declares it."""
    table = np.array([1, 2, 3, 4, 5], np.float32)
    body = oh.make_graph(
        [
            oh.make_node("Identity", ["cond_in"], ["cond_out"]),
            oh.make_node("Constant", [], ["x"], value=onnx.numpy_helper.from_array(table)),
            oh.make_node("Constant", [], ["one"], value=onnx.numpy_helper.from_array(np.array(1, np.int64))),
            oh.make_node("Add", ["i", "one"], ["end"]),
            oh.make_node("Unsqueeze", ["i", "zero_axis"], ["start1"]),
            oh.make_node("Unsqueeze", ["end", "zero_axis"], ["end1"]),
            oh.make_node("Slice", ["x", "start1", "end1"], ["row"]),
            oh.make_node("Add", ["y_in", "row"], ["y_out"]),
            oh.make_node("Identity", ["y_out"], ["scan_out"]),
        ],
        "body",
        [oh.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
         oh.make_tensor_value_info("cond_in", onnx.TensorProto.BOOL, []),
         oh.make_tensor_value_info("y_in", onnx.TensorProto.FLOAT, [1])],
        [oh.make_tensor_value_info("cond_out", onnx.TensorProto.BOOL, []),
         oh.make_tensor_value_info("y_out", onnx.TensorProto.FLOAT, [1]),
         oh.make_tensor_value_info("scan_out", onnx.TensorProto.FLOAT, [1])],
        [onnx.numpy_helper.from_array(np.array([0], np.int64), "zero_axis")],
    )
    graph = oh.make_graph(
        [oh.make_node("Loop", ["m", "cond", "y"], ["y_final", "rows"], body=body)], "loop",
        [oh.make_tensor_value_info("m", onnx.TensorProto.INT64, []),
         oh.make_tensor_value_info("cond", onnx.TensorProto.BOOL, []),
         oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
        [oh.make_tensor_value_info("y_final", onnx.TensorProto.FLOAT, [1]),
         oh.make_tensor_value_info("rows", onnx.TensorProto.FLOAT, [None, 1])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)], ir_version=IR_VERSION)
    check(model, {"m": np.array(4, np.int64), "cond": np.array(True), "y": np.array([-2.0], np.float32)})


# -- grid sample -------------------------------------------------------------------------
GRID_CASES = [
    (mode, padding, align, rank)
    for mode in ("nearest", "linear", "cubic")
    for padding in ("zeros", "border", "reflection")
    for align in (0, 1)
    for rank in (4, 5)
    if not (mode == "cubic" and rank == 5)  # ONNX defines cubic for 4-D inputs only
]


@pytest.mark.parametrize("mode,padding,align,rank", GRID_CASES, ids=lambda v: str(v))
def test_grid_sample(mode, padding, align, rank):
    spatial, out = ((3, 4), (2, 5)) if rank == 4 else ((3, 2, 4), (2, 3, 2))
    x = rand(2, 2, *spatial, seed=40)
    # Coordinates well past [-1, 1] exercise every padding mode's folding and clamping.
    grid = rand(2, *out, rank - 2, seed=41, low=-2.6, high=2.6)
    grid[0, 0, 0] = 0.5 / spatial[-1] * 2 - 1  # a pixel centre's exact half, where rounding modes differ
    inputs = {"x": x, "grid": grid}
    model = single_node_model("GridSample", inputs, attrs={"mode": mode, "padding_mode": padding, "align_corners": align},
                              opset=22)
    check_reference(model, inputs, rtol=1e-4, atol=1e-5)
