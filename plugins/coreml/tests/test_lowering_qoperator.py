"""QOperator ops (what ``quantize_static(..., quant_format=QOperator)`` writes) against onnxruntime.

Each case is one node with integer inputs fed at run time and constant weights, scales and zero
points; the optimise stage's ``decompose_qoperator`` pass rewrites it into DequantizeLinear ->
float op -> QuantizeLinear, which is lowered and run in the MIL interpreter. The com.microsoft
ops have no ONNX node tests: their cases follow onnxruntime's docs/ContribOperators.md.

Tolerance: onnxruntime's integer kernels accumulate in int32 (or use lookup tables) and round
once; the decomposition computes the same value in float32 and rounds it, so a quantised output
may land one step away where the exact value sits on a rounding boundary (x.5 before rounding).
We allow one step and require nearly all elements to be exact; the scales are chosen so ties are
not the common case (with x_scale / y_scale = 1.5 and a 3x3 average, every other value is a tie).
Float outputs (QGemm without y_scale) compare closely.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx_cases import int8_weights, lower, lower_and_run, rand, run_onnxruntime, single_node_model

from edgebuild.graph.quantized.qoperator import DecomposeQOperator

MS = "com.microsoft"


def _ints(shape, dtype, seed=0):
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, info.max + 1, shape).astype(dtype)


def _zero(dtype, value=None):
    """A zero point near the middle of the type's range (uint8) or near 0 (int8)."""
    return np.array(value if value is not None else (128 if dtype == np.uint8 else 3), dtype)


def _decomposed(model: onnx.ModelProto) -> onnx.ModelProto:
    ir_model = ir.serde.deserialize_model(model)
    assert DecomposeQOperator().apply(ir_model) == 1
    assert {n.op_type for n in ir_model.graph} >= {"DequantizeLinear"}
    return ir.serde.serialize_model(ir_model)


def assert_within_one_step(actual, expected, name=""):
    """Quantised outputs: same shape, at most one step apart, and at least 97% exactly equal."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, name
    difference = np.abs(actual.astype(np.int64) - expected.astype(np.int64))
    assert difference.max() <= 1, f"{name}: {difference.max()} steps apart"
    assert (difference == 0).mean() >= 0.97, f"{name}: {(difference != 0).mean():.1%} of elements off by one"


def check_qoperator(op_type, inputs, *, initializers, attrs=None, domain=MS, opset=13):
    """The decomposed node, lowered and interpreted, against onnxruntime on the original node."""
    model = single_node_model(op_type, inputs, attrs=attrs, opset=opset, initializers=initializers, domain=domain)
    feeds = {k: v for k, v in inputs.items() if v is not None and k not in initializers}
    expected = run_onnxruntime(model, feeds)
    actual = lower_and_run(_decomposed(model), feeds)
    for name, reference in expected.items():
        if reference.dtype.kind == "f":
            np.testing.assert_allclose(actual[name], reference, rtol=1e-4, atol=1e-4 * np.abs(reference).max())
        else:
            assert_within_one_step(actual[name], reference, name)
    return model, feeds, expected


# -- QLinearConv (ai.onnx) ----------------------------------------------------------------------
@pytest.mark.parametrize("act", [np.uint8, np.int8])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("group", [1, 4])
def test_qlinear_conv(act, per_channel, group):
    out_channels, in_channels = 8, 4
    weight = int8_weights((out_channels, in_channels // group, 3, 3), seed=1)
    w_scale = rand(out_channels, seed=2, low=0.002, high=0.01) if per_channel else np.float32(0.005)
    w_zero = np.zeros(out_channels, np.int8) if per_channel else np.int8(0)
    inputs = {
        "x": _ints((1, in_channels, 9, 9), act, seed=3), "x_scale": np.float32(0.02), "x_zero_point": _zero(act),
        "w": weight, "w_scale": w_scale, "w_zero_point": w_zero,
        "y_scale": np.float32(0.05), "y_zero_point": _zero(act, 120 if act == np.uint8 else -5),
        "B": np.random.default_rng(4).integers(-2000, 2000, out_channels).astype(np.int32),
    }
    check_qoperator("QLinearConv", inputs, initializers=[k for k in inputs if k != "x"], domain="",
                    attrs={"pads": [1, 1, 1, 1], "strides": [2, 2], "group": group})


# -- QLinearMatMul (ai.onnx) --------------------------------------------------------------------
@pytest.mark.parametrize("act", [np.uint8, np.int8])
@pytest.mark.parametrize("per_column", [False, True])
def test_qlinear_matmul(act, per_column):
    inputs = {
        "a": _ints((2, 5, 16), act, seed=5), "a_scale": np.float32(0.03), "a_zero_point": _zero(act),
        "b": int8_weights((16, 6), seed=6),
        "b_scale": rand(6, seed=7, low=0.002, high=0.01) if per_column else np.float32(0.004),
        "b_zero_point": np.zeros(6, np.int8) if per_column else np.int8(0),
        "y_scale": np.float32(0.1), "y_zero_point": _zero(act),
    }
    check_qoperator("QLinearMatMul", inputs, initializers=[k for k in inputs if k != "a"], domain="")


# -- com.microsoft QGemm ------------------------------------------------------------------------
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("quantized_output", [True, False])
@pytest.mark.parametrize("per_column", [False, True])
def test_qgemm(trans_b, quantized_output, per_column):
    n = 6
    b = int8_weights((n, 16) if trans_b else (16, n), seed=8)
    inputs = {
        "A": _ints((4, 16), np.uint8, seed=9), "a_scale": np.float32(0.02), "a_zero_point": np.uint8(120),
        "B": b, "b_scale": rand(n, seed=10, low=0.002, high=0.01) if per_column else np.float32(0.005),
        "b_zero_point": np.zeros(n, np.int8) if per_column else np.int8(0),
        "C": np.random.default_rng(11).integers(-3000, 3000, n).astype(np.int32),
        "y_scale": np.float32(0.08) if quantized_output else None,
        "y_zero_point": np.uint8(128) if quantized_output else None,
    }
    check_qoperator("QGemm", inputs, initializers=[k for k in inputs if k != "A"],
                    attrs={"transB": trans_b, "alpha": 0.75})


# -- com.microsoft element-wise ops -------------------------------------------------------------
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("act", [np.uint8, np.int8])
def test_qlinear_binary_broadcasts(op, act):
    inputs = {
        "A": _ints((2, 3, 4, 5), act, seed=12), "A_scale": np.float32(0.0413), "A_zero_point": _zero(act),
        "B": _ints((3, 1, 5), act, seed=13), "B_scale": np.float32(0.0297), "B_zero_point": _zero(act, 1),
        "C_scale": np.float32(0.0611 if op == "QLinearAdd" else 0.2039), "C_zero_point": _zero(act),
    }
    check_qoperator(op, inputs, initializers=["A_scale", "A_zero_point", "B_scale", "B_zero_point", "C_scale",
                                              "C_zero_point"])


def test_qlinear_add_of_a_constant_operand():
    """A quantised constant addend (B) is a weight: it becomes a DequantizeLinear of an initializer."""
    inputs = {
        "A": _ints((2, 8), np.uint8, seed=14), "A_scale": np.float32(0.04), "A_zero_point": np.uint8(128),
        "B": _ints((8,), np.uint8, seed=15), "B_scale": np.float32(0.01), "B_zero_point": np.uint8(100),
        "C_scale": np.float32(0.05), "C_zero_point": np.uint8(128),
    }
    check_qoperator("QLinearAdd", inputs, initializers=[k for k in inputs if k != "A"])


@pytest.mark.parametrize("act", [np.uint8, np.int8])
def test_qlinear_sigmoid(act):
    inputs = {"X": _ints((3, 40), act, seed=16), "X_scale": np.float32(0.05), "X_zero_point": _zero(act),
              "Y_scale": np.float32(1 / 256), "Y_zero_point": _zero(act, 0 if act == np.uint8 else -128)}
    check_qoperator("QLinearSigmoid", inputs, initializers=["X_scale", "X_zero_point", "Y_scale", "Y_zero_point"])


@pytest.mark.parametrize("act", [np.uint8, np.int8])
def test_qlinear_leaky_relu(act):
    inputs = {"X": _ints((3, 40), act, seed=17), "X_scale": np.float32(0.05), "X_zero_point": _zero(act),
              "Y_scale": np.float32(0.04), "Y_zero_point": _zero(act, 100 if act == np.uint8 else -20)}
    check_qoperator("QLinearLeakyRelu", inputs, initializers=["X_scale", "X_zero_point", "Y_scale", "Y_zero_point"],
                    attrs={"alpha": 0.2})


def test_qlinear_concat_requantises_each_input():
    inputs = {"Y_scale": np.float32(0.05), "Y_zero_point": np.uint8(128)}
    for i, (scale, zero) in enumerate([(0.02, 100), (0.07, 128), (0.05, 128)]):
        inputs |= {f"X{i}": _ints((1, 2 + i, 3, 3), np.uint8, seed=18 + i), f"X{i}_scale": np.float32(scale),
                   f"X{i}_zero_point": np.uint8(zero)}
    runtime = {"X0", "X1", "X2"}
    check_qoperator("QLinearConcat", inputs, initializers=[k for k in inputs if k not in runtime], attrs={"axis": 1})


@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_global_average_pool(channels_last):
    shape = (2, 5, 6, 4) if channels_last else (2, 4, 5, 6)
    inputs = {"X": _ints(shape, np.uint8, seed=21), "x_scale": np.float32(0.03), "x_zero_point": np.uint8(128),
              "y_scale": np.float32(0.01), "y_zero_point": np.uint8(128)}
    check_qoperator("QLinearGlobalAveragePool", inputs, initializers=["x_scale", "x_zero_point", "y_scale", "y_zero_point"],
                    attrs={"channels_last": channels_last})


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "channels_last": 1},
], ids=["strided", "padded_counted", "ceil", "channels_last"])
def test_qlinear_average_pool(attrs):
    shape = (1, 7, 7, 3) if attrs.get("channels_last") else (1, 3, 7, 7)
    inputs = {"X": _ints(shape, np.int8, seed=22), "x_scale": np.float32(0.0307), "x_zero_point": np.int8(2),
              "y_scale": np.float32(0.0213), "y_zero_point": np.int8(-3)}
    check_qoperator("QLinearAveragePool", inputs, initializers=["x_scale", "x_zero_point", "y_scale", "y_zero_point"],
                    attrs=attrs)


# -- weights stay compressed; the lowering without the pass -------------------------------------
def test_decomposed_conv_weight_is_a_constexpr_op():
    weight = _ints((8, 4, 3, 3), np.int8, seed=23)
    inputs = {"x": _ints((1, 4, 6, 6), np.uint8, seed=24), "x_scale": np.float32(0.02), "x_zero_point": np.uint8(128),
              "w": weight, "w_scale": rand(8, seed=25, low=0.002, high=0.01), "w_zero_point": np.zeros(8, np.int8),
              "y_scale": np.float32(0.05), "y_zero_point": np.uint8(128)}
    model = single_node_model("QLinearConv", inputs, opset=13, initializers=[k for k in inputs if k != "x"])
    for target, op in [("iOS18", "constexpr_blockwise_shift_scale"), ("iOS16", "constexpr_affine_dequantize")]:
        assert lower(_decomposed(model), target=target).op_counts.get(op) == 1


def test_qoperator_node_lowers_without_the_pass():
    """A model that skipped the optimise stage's pass (or a conformance case) lowers all the same."""
    inputs = {"X": _ints((3, 40), np.uint8, seed=26), "X_scale": np.float32(0.05), "X_zero_point": np.uint8(128),
              "Y_scale": np.float32(1 / 256), "Y_zero_point": np.uint8(0)}
    model = single_node_model("QLinearSigmoid", inputs, opset=13, domain=MS,
                              initializers=["X_scale", "X_zero_point", "Y_scale", "Y_zero_point"])
    expected = run_onnxruntime(model, {"X": inputs["X"]})["y"]
    assert_within_one_step(lower_and_run(model, {"X": inputs["X"]})["y"], expected)


@pytest.mark.parametrize("act", [np.uint8, np.int8])
def test_qlinear_softmax(act):
    inputs = {"X": _ints((2, 3, 10), act, seed=27), "X_scale": np.float32(0.05), "X_zero_point": _zero(act),
              "y_scale": np.float32(1 / 256), "y_zero_point": _zero(act, 0 if act == np.uint8 else -128)}
    check_qoperator("QLinearSoftmax", inputs, initializers=["X_scale", "X_zero_point", "y_scale", "y_zero_point"],
                    attrs={"opset": 13, "axis": -1})


def test_nearest_resize_of_a_quantised_tensor():
    """QOperator graphs resize uint8 tensors directly (MIL's upsample takes floats: exact through fp32)."""
    x = _ints((1, 3, 5, 4), np.uint8, seed=28)
    model = single_node_model("Resize", {"X": x, "roi": None, "scales": np.array([1, 1, 2, 2], np.float32)},
                              attrs={"mode": "nearest"}, opset=13, initializers=["scales"])
    expected = run_onnxruntime(model, {"X": x})["y"]
    np.testing.assert_array_equal(lower_and_run(model, {"X": x})["y"], expected)
