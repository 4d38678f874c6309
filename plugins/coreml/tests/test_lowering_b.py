"""Lowerings of NN, normalisation, resize, RNN, control-flow, quantisation and fused ops.

Each case builds a small ONNX model, lowers it to MIL, runs the program in edgebuild's MIL
interpreter and compares with onnxruntime on the same random inputs.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest
from onnx.reference import ReferenceEvaluator
from onnx_cases import (
    IR_VERSION,
    assert_matches,
    check,
    check_op,
    feeds_of,
    lower,
    lower_and_run,
    run_onnxruntime,
    single_node_model,
)

RTOL, ATOL = 1e-4, 1e-5


def rand(*shape, seed=0, low=-1.0, high=1.0):
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


X4 = rand(2, 3, 9, 8, seed=1)

# -- activations -------------------------------------------------------------------------
ACTIVATIONS = [
    ("Relu", {}, 14), ("LeakyRelu", {"alpha": 0.2}, 16), ("Elu", {"alpha": 0.7}, 6), ("Selu", {}, 6),
    ("Celu", {"alpha": 1.5}, 12), ("Sigmoid", {}, 13), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, 6),
    ("HardSwish", {}, 14), ("Softplus", {}, 1), ("Softsign", {}, 1), ("Tanh", {}, 13),
    ("ThresholdedRelu", {"alpha": 0.25}, 10), ("Gelu", {}, 20), ("Gelu", {"approximate": "tanh"}, 20),
    ("Mish", {}, 18), ("Shrink", {"lambd": 0.3, "bias": 0.1}, 9),
]


@pytest.mark.parametrize("op,attrs,opset", ACTIVATIONS, ids=lambda v: str(v))
def test_activation(op, attrs, opset):
    check_op(op, {"x": X4 * 3}, attrs=attrs, opset=opset, rtol=RTOL, atol=ATOL)


def test_thresholded_relu_drops_values_equal_to_alpha():
    x = np.array([[0.5, 1.0, 1.5]], np.float32)
    check_op("ThresholdedRelu", {"x": x}, attrs={"alpha": 1.0}, opset=10)


@pytest.mark.parametrize("slope_shape", [(1,), (3, 1, 1), (8,)])
def test_prelu_broadcasts_slope(slope_shape):
    check_op("PRelu", {"x": X4, "slope": rand(*slope_shape, seed=2)}, opset=16, initializers=("slope",))


def test_prelu_runtime_slope():
    check_op("PRelu", {"x": X4, "slope": rand(3, 1, 1, seed=2)}, opset=16)


@pytest.mark.parametrize("low,high", [(0.0, 6.0), (0.0, None), (-0.5, 0.25), (None, 0.1), (0.7, 0.2)])
def test_clip_inputs(low, high):
    inputs = {"x": X4 * 8, "min": None if low is None else np.float32(low), "max": None if high is None else np.float32(high)}
    if low is None:
        inputs = {"x": X4 * 8, "min": None, "max": np.float32(high)}
    check_op("Clip", inputs, opset=13, initializers=("min", "max"))


def test_clip_attributes_before_opset_11():
    check_op("Clip", {"x": X4 * 8}, attrs={"min": -1.0, "max": 2.0}, opset=6)


def test_clip_int():
    ints = (X4 * 10).astype(np.int32)
    check_op("Clip", {"x": ints, "min": np.int32(-2), "max": np.int32(4)}, opset=13, initializers=("min", "max"))


def test_clip_relu6_is_a_single_op():
    model = single_node_model("Clip", {"x": X4, "lo": np.float32(0), "hi": np.float32(6)}, opset=13,
                              initializers=("lo", "hi"))
    assert lower(model).op_counts.get("relu6") == 1


def test_activation_fp16():
    x = X4 * 3
    model = single_node_model("HardSwish", {"x": x}, opset=14)
    expected = run_onnxruntime(model, {"x": x})["y"]
    actual = lower_and_run(model, {"x": x}, precision="float16")["y"]
    assert_matches(actual, expected, rtol=1e-2, atol=1e-2)


# -- softmax family ----------------------------------------------------------------------
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset,axis", [(11, 1), (11, 2), (11, -1), (13, 1), (13, -1), (13, 0)])
def test_softmax_family(op, opset, axis):
    check_op(op, {"x": X4 * 4}, attrs={"axis": axis}, opset=opset, rtol=RTOL, atol=ATOL)


def test_softmax_opset11_default_axis_coerces_to_2d():
    check_op("Softmax", {"x": X4 * 4}, opset=11, rtol=RTOL, atol=ATOL)


# -- gemm / matmul -----------------------------------------------------------------------
@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("const_b", [True, False])
@pytest.mark.parametrize("c_shape", [None, (5,), (1, 5), (4, 5), ()])
def test_gemm(trans_a, trans_b, const_b, c_shape):
    a = rand(*((6, 4) if trans_a else (4, 6)), seed=3)
    b = rand(*((5, 6) if trans_b else (6, 5)), seed=4)
    inputs = {"a": a, "b": b, "c": None if c_shape is None else rand(*c_shape, seed=5)}
    attrs = {"transA": trans_a, "transB": trans_b, "alpha": 0.5, "beta": 2.0}
    check_op("Gemm", inputs, attrs=attrs, opset=13, initializers=("b", "c") if const_b else ("c",) if c_shape == () else (), rtol=RTOL, atol=ATOL)


def test_gemm_runtime_c():
    check_op("Gemm", {"a": rand(4, 6), "b": rand(6, 5, seed=1), "c": rand(4, 5, seed=2)}, attrs={"beta": 0.5},
             opset=13, initializers=("b",), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("a_shape,b_shape,const_b", [
    ((2, 3, 4, 6), (6, 5), True), ((2, 3, 4, 6), (6, 5), False), ((3, 4, 6), (3, 6, 5), False),
    ((6,), (6, 5), False), ((2, 4, 6), (6,), False), ((1, 4, 6), (2, 6, 5), False),
])
def test_matmul(a_shape, b_shape, const_b):
    check_op("MatMul", {"a": rand(*a_shape), "b": rand(*b_shape, seed=1)}, opset=13,
             initializers=("b",) if const_b else (), rtol=RTOL, atol=ATOL)


def test_matmul_integer():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 255, (3, 4)).astype(np.uint8)
    b = rng.integers(0, 255, (4, 5)).astype(np.uint8)
    check_op("MatMulInteger", {"a": a, "b": b, "az": np.uint8(12), "bz": np.uint8(200)}, opset=10,
             initializers=("b", "az", "bz"))


def test_gemm_fp16():
    a, b = rand(4, 6), rand(6, 5, seed=1)
    model = single_node_model("Gemm", {"a": a, "b": b}, opset=13, initializers=("b",))
    expected = run_onnxruntime(model, {"a": a})["y"]
    assert_matches(lower_and_run(model, {"a": a}, precision="float16")["y"], expected, rtol=1e-2, atol=1e-2)


# -- convolution -------------------------------------------------------------------------
CONV_CASES = [
    ({}, (1, 6, 10, 9), (4, 6, 3, 3)),
    ({"pads": [1, 0, 2, 1], "strides": [2, 1]}, (1, 6, 10, 9), (4, 6, 3, 3)),
    ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, (1, 6, 10, 9), (4, 6, 3, 2)),
    ({"auto_pad": "SAME_LOWER", "strides": [2, 3]}, (1, 6, 10, 9), (4, 6, 4, 3)),
    ({"auto_pad": "VALID", "dilations": [2, 1]}, (1, 6, 10, 9), (4, 6, 3, 3)),
    ({"group": 2, "pads": [1, 1, 1, 1]}, (2, 6, 10, 9), (4, 3, 3, 3)),
    ({"group": 6}, (1, 6, 10, 9), (6, 1, 3, 3)),
    ({"pads": [2, 1], "strides": [2]}, (1, 6, 11), (4, 6, 3)),
    ({"pads": [1, 0, 1, 0, 1, 1]}, (1, 2, 5, 6, 4), (3, 2, 2, 3, 2)),
]


@pytest.mark.parametrize("attrs,x_shape,w_shape", CONV_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("with_bias", [True, False])
def test_conv(attrs, x_shape, w_shape, with_bias):
    inputs = {"x": rand(*x_shape), "w": rand(*w_shape, seed=1), "b": rand(w_shape[0], seed=2) if with_bias else None}
    check_op("Conv", inputs, attrs=attrs, opset=11, initializers=("w", "b"), rtol=RTOL, atol=ATOL)


def test_conv_runtime_weight_and_bias():
    inputs = {"x": rand(1, 4, 7, 7), "w": rand(5, 4, 3, 3, seed=1), "b": rand(5, seed=2)}
    check_op("Conv", inputs, attrs={"pads": [1, 1, 1, 1]}, opset=11, rtol=RTOL, atol=ATOL)


CONV_TRANSPOSE_CASES = [
    ({"strides": [2, 2]}, (1, 4, 5, 6), (4, 3, 3, 3)),
    ({"strides": [2, 2], "pads": [1, 0, 1, 2]}, (1, 4, 5, 6), (4, 3, 3, 3)),
    ({"strides": [2, 3], "output_padding": [1, 2], "pads": [1, 1, 0, 0]}, (1, 4, 5, 6), (4, 3, 3, 3)),
    ({"strides": [2, 2], "output_shape": [11, 13]}, (1, 4, 5, 6), (4, 3, 3, 3)),
    ({"strides": [2, 2], "auto_pad": "SAME_UPPER"}, (1, 4, 5, 6), (4, 3, 3, 3)),
    ({"strides": [2, 2], "auto_pad": "SAME_LOWER"}, (1, 4, 5, 6), (4, 3, 3, 3)),
    ({"group": 2, "dilations": [2, 1], "strides": [1, 2]}, (1, 4, 5, 6), (4, 2, 3, 2)),
    ({"strides": [3], "output_padding": [2]}, (1, 4, 7), (4, 2, 3)),
]


@pytest.mark.parametrize("attrs,x_shape,w_shape", CONV_TRANSPOSE_CASES, ids=lambda v: str(v))
def test_conv_transpose(attrs, x_shape, w_shape):
    out_channels = w_shape[1] * attrs.get("group", 1)
    inputs = {"x": rand(*x_shape), "w": rand(*w_shape, seed=1), "b": rand(out_channels, seed=2)}
    check_op("ConvTranspose", inputs, attrs=attrs, opset=11, initializers=("w", "b"), rtol=RTOL, atol=ATOL)


def test_conv_fp16():
    x, w = rand(1, 4, 8, 8), rand(6, 4, 3, 3, seed=1)
    model = single_node_model("Conv", {"x": x, "w": w}, attrs={"pads": [1, 1, 1, 1]}, opset=11, initializers=("w",))
    expected = run_onnxruntime(model, {"x": x})["y"]
    assert_matches(lower_and_run(model, {"x": x}, precision="float16")["y"], expected, rtol=2e-2, atol=2e-2)


# -- pooling -----------------------------------------------------------------------------
POOL_CASES = [
    {"kernel_shape": [3, 3]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 0], "ceil_mode": 1},
    {"kernel_shape": [2, 3], "strides": [2, 1], "auto_pad": "SAME_UPPER"},
    {"kernel_shape": [3, 2], "strides": [2, 3], "auto_pad": "SAME_LOWER"},
    {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 0, 0, 1]},
    {"kernel_shape": [2, 2], "dilations": [2, 1], "strides": [2, 2], "ceil_mode": 1},
]


@pytest.mark.parametrize("attrs", POOL_CASES, ids=str)
def test_max_pool(attrs):
    check_op("MaxPool", {"x": X4}, attrs=attrs, opset=12, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("attrs", POOL_CASES, ids=str)
@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool(attrs, include_pad):
    check_op("AveragePool", {"x": X4}, attrs={**attrs, "count_include_pad": include_pad}, opset=19, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("attrs", [POOL_CASES[1], POOL_CASES[3], POOL_CASES[6]], ids=str)
def test_max_pool_indices(attrs, storage_order):
    x = rand(2, 3, 9, 8, seed=7)
    check_op("MaxPool", {"x": x}, attrs={**attrs, "storage_order": storage_order}, opset=12, outputs=2)


def test_pool_1d_and_3d():
    check_op("MaxPool", {"x": rand(2, 3, 11)}, attrs={"kernel_shape": [3], "strides": [2], "ceil_mode": 1}, opset=12)
    check_op("AveragePool", {"x": rand(1, 2, 5, 6, 7)}, attrs={"kernel_shape": [2, 3, 2], "pads": [1, 1, 0, 0, 1, 1]},
             opset=11, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool(p):
    check_op("LpPool", {"x": X4}, attrs={"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1], "p": p},
             opset=18, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
def test_global_pool(op):
    check_op(op, {"x": X4}, opset=13, rtol=RTOL, atol=ATOL)


def test_pool_fp16():
    model = single_node_model("AveragePool", {"x": X4}, attrs={"kernel_shape": [3, 3], "ceil_mode": 1, "strides": [2, 2]},
                              opset=19)
    expected = run_onnxruntime(model, {"x": X4})["y"]
    assert_matches(lower_and_run(model, {"x": X4}, precision="float16")["y"], expected, rtol=1e-2, atol=1e-2)


# -- normalisation -----------------------------------------------------------------------
def test_batch_normalization():
    c = X4.shape[1]
    inputs = {"x": X4, "s": rand(c, seed=2), "b": rand(c, seed=3), "m": rand(c, seed=4), "v": rand(c, seed=5, low=0.1)}
    check_op("BatchNormalization", inputs, opset=15, initializers=("s", "b", "m", "v"), rtol=RTOL, atol=ATOL)
    check_op("BatchNormalization", inputs, opset=15, rtol=RTOL, atol=ATOL)  # runtime statistics
    flat = {**inputs, "x": rand(4, c, seed=6)}
    check_op("BatchNormalization", flat, opset=15, initializers=("s", "b", "m", "v"), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("shape", [(2, 3, 9, 8), (2, 3, 7), (1, 3, 4, 5, 3)])
def test_instance_normalization(shape):
    inputs = {"x": rand(*shape), "s": rand(3, seed=2), "b": rand(3, seed=3)}
    check_op("InstanceNormalization", inputs, opset=6, initializers=("s", "b"), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("axis", [-1, 1, 2])
def test_layer_normalization(axis):
    scale_shape = X4.shape[axis:]
    inputs = {"x": X4, "s": rand(*scale_shape, seed=2), "b": rand(*scale_shape, seed=3)}
    check_op("LayerNormalization", inputs, attrs={"axis": axis, "epsilon": 1e-3}, opset=17,
             initializers=("s", "b"), rtol=RTOL, atol=ATOL)


def test_layer_normalization_stats_and_broadcast_scale():
    inputs = {"x": X4, "s": rand(1, 8, seed=2), "b": None}
    check_op("LayerNormalization", inputs, attrs={"axis": 2}, opset=17, outputs=3, initializers=("s",),
             rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("opset", [18, 21])
def test_group_normalization(opset):
    x = rand(2, 6, 5, 4)
    size = 3 if opset < 21 else 6
    inputs = {"x": x, "s": rand(size, seed=2), "b": rand(size, seed=3)}
    model = single_node_model("GroupNormalization", inputs, attrs={"num_groups": 3, "epsilon": 1e-4}, opset=opset,
                              initializers=("s", "b"))
    # the reference: per-group statistics, then the opset's affine
    grouped = x.reshape(2, 3, -1)
    normed = ((grouped - grouped.mean(-1, keepdims=True)) / np.sqrt(grouped.var(-1, keepdims=True) + 1e-4))
    if opset < 21:
        expected = (normed * inputs["s"].reshape(1, 3, 1) + inputs["b"].reshape(1, 3, 1)).reshape(x.shape)
    else:
        expected = normed.reshape(x.shape) * inputs["s"].reshape(1, 6, 1, 1) + inputs["b"].reshape(1, 6, 1, 1)
    assert_matches(lower_and_run(model, {"x": x})["y"], expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("p,axis", [(1, 1), (2, -1), (2, 0)])
def test_lp_normalization(p, axis):
    check_op("LpNormalization", {"x": X4}, attrs={"p": p, "axis": axis}, opset=1, rtol=RTOL, atol=ATOL)


def test_lrn():
    check_op("LRN", {"x": X4 * 3}, attrs={"size": 3, "alpha": 0.01, "beta": 0.6, "bias": 1.5}, opset=13,
             rtol=RTOL, atol=ATOL)


def test_lrn_even_size_window_is_asymmetric():
    """onnxruntime refuses even sizes; the reference is the ONNX formula in numpy."""
    x = X4 * 3
    model = single_node_model("LRN", {"x": x}, attrs={"size": 4, "alpha": 0.01, "beta": 0.6, "bias": 1.5}, opset=13)
    padded = np.pad(x * x, [(0, 0), (1, 2), (0, 0), (0, 0)])
    window = sum(padded[:, i:i + x.shape[1]] for i in range(4))
    expected = x / (1.5 + 0.01 / 4 * window) ** 0.6
    assert_matches(lower_and_run(model, {"x": x})["y"], expected, rtol=RTOL, atol=ATOL)


def test_mean_variance_normalization():
    check_op("MeanVarianceNormalization", {"x": X4}, opset=13, rtol=RTOL, atol=ATOL)
    check_op("MeanVarianceNormalization", {"x": X4}, attrs={"axes": [1, 3]}, opset=13, rtol=RTOL, atol=ATOL)


def test_normalization_fp16():
    inputs = {"x": X4, "s": rand(8, seed=2), "b": rand(8, seed=3)}
    model = single_node_model("LayerNormalization", inputs, opset=17, initializers=("s", "b"))
    expected = run_onnxruntime(model, {"x": X4})["y"]
    assert_matches(lower_and_run(model, {"x": X4}, precision="float16")["y"], expected, rtol=2e-2, atol=2e-2)


# -- resize ------------------------------------------------------------------------------
RESIZE_X = rand(1, 2, 5, 7, seed=11)
RESIZE_GEOMETRY = {
    "up": {"scales": np.array([1, 1, 2, 3], np.float32)},
    "down": {"scales": np.array([1, 1, 0.6, 0.5], np.float32)},
    "fractional": {"scales": np.array([1, 1, 1.7, 0.8], np.float32)},
    "sizes": {"sizes": np.array([1, 2, 9, 5], np.int64)},
}
COORDINATE_MODES = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                    "tf_crop_and_resize"]
RESIZE_GRID = [(m, c, n, g) for m in ("nearest", "linear", "cubic") for c in COORDINATE_MODES
               for n in (["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"] if m == "nearest" else [None])
               for g in RESIZE_GEOMETRY]


@pytest.mark.parametrize("mode,coordinate_mode,nearest_mode,geometry", RESIZE_GRID, ids=str)
def test_resize_modes_grid(mode, coordinate_mode, nearest_mode, geometry):
    roi = np.array([0, 0, 0.1, 0.2, 1, 1, 0.8, 1.1], np.float32) if coordinate_mode == "tf_crop_and_resize" else None
    inputs = {"x": RESIZE_X, "roi": roi, "scales": None, "sizes": None, **RESIZE_GEOMETRY[geometry]}
    attrs = {"mode": mode, "coordinate_transformation_mode": coordinate_mode, "extrapolation_value": -3.0}
    if nearest_mode:
        attrs["nearest_mode"] = nearest_mode
    constants = ("roi", "scales", "sizes")
    if coordinate_mode in ("align_corners", "tf_crop_and_resize") and geometry in ("down", "fractional"):
        # The spec's length_resized is scale * length_original, fractional here; onnxruntime
        # uses the floored output size instead, so the spec's reference evaluator decides.
        model = single_node_model("Resize", inputs, attrs=attrs, opset=13, initializers=constants)
        feeds = feeds_of(inputs, constants)
        expected = ReferenceEvaluator(model).run(None, feeds)[0]
        assert_matches(lower_and_run(model, feeds)["y"], expected, rtol=RTOL, atol=ATOL)
        return
    check_op("Resize", inputs, attrs=attrs, opset=13, initializers=constants, rtol=RTOL, atol=ATOL)


RESIZE_OPTIONS = [
    ({"mode": "linear", "antialias": 1}, {"scales": np.array([1, 1, 0.5, 0.4], np.float32)}),
    ({"mode": "cubic", "antialias": 1}, {"scales": np.array([1, 1, 0.5, 0.4], np.float32)}),
    ({"mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": -0.5}, {"scales": np.array([1, 1, 1.5, 0.7], np.float32)}),
    ({"mode": "linear", "axes": [3, 2]}, {"scales": np.array([0.7, 1.5], np.float32)}),
    ({"mode": "linear", "keep_aspect_ratio_policy": "not_larger", "axes": [2, 3]}, {"sizes": np.array([5, 8], np.int64)}),
    ({"mode": "nearest", "keep_aspect_ratio_policy": "not_smaller", "axes": [2, 3]}, {"sizes": np.array([5, 8], np.int64)}),
]


@pytest.mark.parametrize("attrs,extra", RESIZE_OPTIONS, ids=str)
def test_resize_options_opset18(attrs, extra):
    inputs = {"x": rand(1, 2, 9, 11, seed=12), "roi": None, "scales": None, "sizes": None, **extra}
    check_op("Resize", inputs, attrs=attrs, opset=18, initializers=("roi", "scales", "sizes"), rtol=RTOL, atol=ATOL)


def test_resize_integer_nearest_upsample_is_one_op():
    inputs = {"x": RESIZE_X, "roi": None, "scales": np.array([1, 1, 2, 2], np.float32)}
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    model = single_node_model("Resize", inputs, attrs=attrs, opset=13, initializers=("scales",))
    assert lower(model).op_counts.get("upsample_nearest_neighbor") == 1
    check(model, inputs, initializers=("scales",))


@pytest.mark.parametrize("op,opset", [("Resize", 10), ("Upsample", 9)])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_opset10_and_upsample(op, opset, mode):
    inputs = {"x": rand(1, 2, 9, 11), "scales": np.array([1, 1, 2, 1.5], np.float32)}
    check_op(op, inputs, attrs={"mode": mode}, opset=opset, initializers=("scales",), rtol=RTOL, atol=ATOL)


def test_resize_runtime_sizes_are_refused():
    from edgebuild.errors import BuildError

    inputs = {"x": RESIZE_X, "roi": None, "scales": None, "sizes": np.array([1, 2, 9, 5], np.int64)}
    model = single_node_model("Resize", inputs, opset=13)
    with pytest.raises(BuildError, match="sizes must be a constant"):
        lower(model)


def test_resize_fp16():
    inputs = {"x": RESIZE_X, "roi": None, "scales": np.array([1, 1, 1.7, 0.8], np.float32)}
    model = single_node_model("Resize", inputs, attrs={"mode": "cubic"}, opset=13, initializers=("scales",))
    expected = run_onnxruntime(model, {"x": RESIZE_X})["y"]
    assert_matches(lower_and_run(model, {"x": RESIZE_X}, precision="float16")["y"], expected, rtol=1e-2, atol=1e-2)


# -- depth/space and pad -----------------------------------------------------------------
@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode):
    check_op("DepthToSpace", {"x": rand(2, 8, 3, 4)}, attrs={"blocksize": 2, "mode": mode}, opset=13)


def test_space_to_depth():
    check_op("SpaceToDepth", {"x": rand(2, 3, 6, 4)}, attrs={"blocksize": 2}, opset=13)


PAD_CASES = [
    ("constant", [0, 0, 1, 2, 0, 1, 3, 0], 1.5),
    ("constant", [0, 1, -1, 2, 0, 0, 1, -2], 0.0),
    ("reflect", [0, 0, 2, 1, 0, 0, 1, 3], None),
    ("reflect", [0, 1, 0, 0, 0, 2, 0, 0], None),
    ("edge", [0, 0, 4, 1, 0, 0, 9, 2], None),
    ("edge", [1, 0, 0, 1, 0, 2, 0, 0], None),
    ("wrap", [0, 0, 2, 3, 0, 0, 1, 2], None),
]


@pytest.mark.parametrize("mode,pads,value", PAD_CASES, ids=str)
def test_pad(mode, pads, value):
    inputs = {"x": rand(2, 3, 5, 4), "pads": np.array(pads, np.int64),
              "value": None if value is None else np.float32(value)}
    check_op("Pad", inputs, attrs={"mode": mode}, opset=19, initializers=("pads", "value"))


def test_pad_axes_input_and_old_attribute_form():
    inputs = {"x": rand(2, 3, 5, 4), "pads": np.array([1, 2, 0, 3], np.int64), "value": np.float32(-1),
              "axes": np.array([-1, 1], np.int64)}
    check_op("Pad", inputs, attrs={"mode": "constant"}, opset=18, initializers=("pads", "value", "axes"))
    check_op("Pad", {"x": rand(2, 3, 5, 4)}, attrs={"pads": [0, 0, 1, 1, 0, 0, 2, 0], "value": 2.0}, opset=2)


# -- recurrent ---------------------------------------------------------------------------
def _lstm_inputs(direction, *, peepholes, layout=0, steps=5, batch=2, features=3, hidden=4):
    d = 2 if direction == "bidirectional" else 1
    x_shape = (steps, batch, features) if layout == 0 else (batch, steps, features)
    state_shape = (d, batch, hidden) if layout == 0 else (batch, d, hidden)
    return {"x": rand(*x_shape), "w": rand(d, 4 * hidden, features, seed=1), "r": rand(d, 4 * hidden, hidden, seed=2),
            "b": rand(d, 8 * hidden, seed=3), "seq": None, "h0": rand(*state_shape, seed=4),
            "c0": rand(*state_shape, seed=5), "p": rand(d, 3 * hidden, seed=6) if peepholes else None}


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("peepholes", [False, True])
def test_lstm(direction, peepholes):
    inputs = _lstm_inputs(direction, peepholes=peepholes)
    check_op("LSTM", inputs, attrs={"hidden_size": 4, "direction": direction}, opset=14, outputs=3,
             initializers=("w", "r", "b", "p"), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("with_states", [True, False])
def test_lstm_batch_first_layout(with_states):
    """onnxruntime lacks layout=1; the reference is the time-major model on transposed data."""
    attrs = {"hidden_size": 4, "direction": "bidirectional"}
    time_major = _lstm_inputs("bidirectional", peepholes=False)
    if not with_states:
        time_major.update(h0=None, c0=None)
    batch_major = {**time_major, "x": time_major["x"].transpose(1, 0, 2)}
    if with_states:
        batch_major.update(h0=time_major["h0"].transpose(1, 0, 2), c0=time_major["c0"].transpose(1, 0, 2))
    weights = ("w", "r", "b")
    reference = single_node_model("LSTM", time_major, attrs=attrs, opset=14, outputs=3, initializers=weights)
    expected = run_onnxruntime(reference, {k: v for k, v in time_major.items() if v is not None and k not in weights})
    model = single_node_model("LSTM", batch_major, attrs={**attrs, "layout": 1}, opset=14, outputs=3,
                              initializers=weights)
    actual = lower_and_run(model, {k: v for k, v in batch_major.items() if v is not None and k not in weights})
    assert_matches(actual["y0"], expected["y0"].transpose(2, 0, 1, 3), rtol=RTOL, atol=ATOL)
    assert_matches(actual["y1"], expected["y1"].transpose(1, 0, 2), rtol=RTOL, atol=ATOL)
    assert_matches(actual["y2"], expected["y2"].transpose(1, 0, 2), rtol=RTOL, atol=ATOL)


# -- control flow ------------------------------------------------------------------------
def _if_model():
    then_graph = oh.make_graph([oh.make_node("Mul", ["x", "x"], ["t"])], "then", [],
                               [oh.make_tensor_value_info("t", onnx.TensorProto.FLOAT, [2, 3])])
    else_graph = oh.make_graph([oh.make_node("Neg", ["x"], ["e"])], "else", [],
                               [oh.make_tensor_value_info("e", onnx.TensorProto.FLOAT, [2, 3])])
    nodes = [
        oh.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        oh.make_node("Greater", ["s", "zero"], ["c"]),
        oh.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=else_graph),
    ]
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])],
                          [onh.from_array(np.float32(0), "zero")])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)], ir_version=IR_VERSION)


@pytest.mark.parametrize("sign", [1, -1], ids=["then", "else"])
def test_if_runs_either_branch(sign):
    x = np.abs(rand(2, 3)) * sign + 0.01 * sign
    model = _if_model()
    assert lower(model).op_counts.get("cond") == 1
    check(model, {"x": x})


# -- quantisation ------------------------------------------------------------------------
def _program_ops(result):
    return [op.op_type for op in result.program.functions["main"].operations]


@pytest.mark.parametrize("target,op", [("iOS18", "constexpr_blockwise_shift_scale"), ("iOS16", "constexpr_affine_dequantize")])
@pytest.mark.parametrize("per_axis", [False, True])
def test_dequantize_constant_weight_stays_compressed(target, op, per_axis):
    rng = np.random.default_rng(0)
    weight = rng.integers(-128, 127, (6, 4)).astype(np.int8)
    scale = rand(6, seed=1, low=0.01, high=0.1) if per_axis else np.float32(0.05)
    zero = rng.integers(-5, 5, 6).astype(np.int8) if per_axis else np.int8(3)
    deq = oh.make_node("DequantizeLinear", ["w", "s", "z"], ["wf"], axis=0)
    matmul = oh.make_node("MatMul", ["x", "wf"], ["y"])
    graph = oh.make_graph([deq, matmul], "g", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 6])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 4])],
                          [onh.from_array(weight, "w"), onh.from_array(np.asarray(scale), "s"),
                           onh.from_array(np.asarray(zero), "z")])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)], ir_version=IR_VERSION)
    result = lower(model, target=target)
    assert op in _program_ops(result)
    x = rand(3, 6, seed=2)
    expected = run_onnxruntime(model, {"x": x})["y"]
    assert_matches(lower_and_run(model, {"x": x}, target=target)["y"], expected, rtol=RTOL, atol=ATOL)


def test_dequantize_runtime_tensor_per_axis():
    rng = np.random.default_rng(0)
    inputs = {"x": rng.integers(0, 255, (2, 3, 4)).astype(np.uint8), "s": rand(3, seed=1, low=0.01, high=0.1),
              "z": rng.integers(0, 255, 3).astype(np.uint8)}
    check_op("DequantizeLinear", inputs, attrs={"axis": 1}, opset=13, initializers=("s", "z"), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("zero_dtype", [np.uint8, np.int8])
def test_quantize_linear(zero_dtype):
    inputs = {"x": rand(2, 3, 4) * 5, "s": rand(3, seed=1, low=0.02, high=0.05), "z": np.array([0, 7, 3], zero_dtype)}
    check_op("QuantizeLinear", inputs, attrs={"axis": 1}, opset=13, initializers=("s", "z"))


# -- fused edgebuild:: ops ---------------------------------------------------------------
def _fused_model(op, inputs, *, attrs=None, initializers=()):
    model = single_node_model(op, inputs, attrs=attrs, domain="edgebuild", initializers=initializers)
    return model


def test_fused_linear_silu_gelu():
    x, w, b = rand(2, 3, 6), rand(6, 5, seed=1), rand(5, seed=2)
    for const in (True, False):
        model = _fused_model("Linear", {"x": x, "w": w, "b": b}, initializers=("w", "b") if const else ())
        feeds = {"x": x} if const else {"x": x, "w": w, "b": b}
        assert_matches(lower_and_run(model, feeds)["y"], x @ w + b, rtol=RTOL, atol=ATOL)
    model = _fused_model("Silu", {"x": x})
    assert_matches(lower_and_run(model, {"x": x})["y"], x / (1 + np.exp(-x)), rtol=RTOL, atol=ATOL)
    from math import erf, pi, sqrt

    exact = 0.5 * x * (1 + np.vectorize(erf)(x / sqrt(2)))
    tanh = 0.5 * x * (1 + np.tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))
    assert_matches(lower_and_run(_fused_model("Gelu", {"x": x}), {"x": x})["y"], exact, rtol=RTOL, atol=ATOL)
    model = _fused_model("Gelu", {"x": x}, attrs={"approximate": "tanh"})
    assert_matches(lower_and_run(model, {"x": x})["y"], tanh, rtol=RTOL, atol=ATOL)


def _attention_reference(q, k, v, mask, scale):
    scores = q @ np.swapaxes(k, -1, -2) * scale + (0 if mask is None else mask)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    return (scores / scores.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("target", ["iOS17", "iOS18"])
@pytest.mark.parametrize("scale", [None, 0.3])
@pytest.mark.parametrize("with_mask", [False, True])
def test_fused_attention(target, scale, with_mask):
    q, k, v = rand(2, 3, 4, 8), rand(2, 3, 5, 8, seed=1), rand(2, 3, 5, 6, seed=2)
    mask = rand(4, 5, seed=3) if with_mask else None
    model = _fused_model("ScaledDotProductAttention", {"q": q, "k": k, "v": v, "mask": mask},
                         attrs=None if scale is None else {"scale": scale}, initializers=("mask",))
    result = lower(model, target=target)
    assert ("scaled_dot_product_attention" in _program_ops(result)) == (target == "iOS18")
    actual = lower_and_run(model, {"q": q, "k": k, "v": v}, target=target)["y"]
    expected = _attention_reference(q, k, v, mask, 1 / np.sqrt(8) if scale is None else scale)
    assert_matches(actual, expected, rtol=RTOL, atol=ATOL)
