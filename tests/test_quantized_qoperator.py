"""The decompose_qoperator pass (edgebuild/graph/quantized/qoperator.py) on hand-built QOperator nodes.

No backend and no onnxruntime here: the ai.onnx ops (QLinearConv, QLinearMatMul) are checked
against onnx's reference evaluator on the original node, the com.microsoft ops against their
formulas in onnxruntime's docs/ContribOperators.md. The backends' tests check every op against
onnxruntime itself. Integer kernels round once after an integer sum; the decomposition rounds a
float sum, so outputs may differ by one step on a rounding tie.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from edgebuild.errors import BuildError
from edgebuild.graph.fused_reference import run_reference
from edgebuild.graph.optimize import optimize
from edgebuild.graph.quantized.qoperator import DecomposeQOperator, QOperatorError

MS = "com.microsoft"
RNG = np.random.default_rng(0)


def ints(shape, dtype, seed):
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, info.max + 1, shape).astype(dtype)


def one_node(op, inputs: dict, runtime: set[str], out_type, attrs=None, domain="", opset=13, out_shape=None):
    node = helper.make_node(op, [k if v is not None else "" for k, v in inputs.items()], ["y"], name="q",
                            domain=domain, **(attrs or {}))
    graph_inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                    for k, v in inputs.items() if k in runtime]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in inputs.items() if v is not None and k not in runtime]
    graph = helper.make_graph([node], "g", graph_inputs, [helper.make_tensor_value_info("y", out_type, out_shape)], inits)
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(MS, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=opsets, ir_version=9)


def decompose(model: onnx.ModelProto) -> ir.Model:
    decomposed = ir.serde.deserialize_model(model)
    assert DecomposeQOperator().apply(decomposed) == 1
    return decomposed


def assert_within_one_step(actual, expected):
    difference = np.abs(np.asarray(actual).astype(np.int64) - np.asarray(expected).astype(np.int64))
    assert difference.max() <= 1 and (difference == 0).mean() >= 0.97, difference.max()


def requantize(value, scale, zero, dtype):
    info = np.iinfo(dtype)
    return np.clip(np.rint(value / scale) + zero, info.min, info.max).astype(dtype)


def ops(model: ir.Model) -> list[str]:
    return [node.op_type for node in model.graph]


# -- ai.onnx ops against onnx's reference ---------------------------------------------------------
@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_conv_matches_the_reference_and_keeps_the_weight_quantised(per_channel):
    inputs = {
        "x": ints((1, 3, 7, 7), np.uint8, 1), "x_scale": np.float32(0.0213), "x_zero_point": np.uint8(128),
        "w": ints((4, 3, 3, 3), np.int8, 2),
        "w_scale": np.linspace(0.002, 0.006, 4, dtype=np.float32) if per_channel else np.float32(0.004),
        "w_zero_point": np.zeros(4, np.int8) if per_channel else np.int8(0),
        "y_scale": np.float32(0.0517), "y_zero_point": np.uint8(120),
        "B": RNG.integers(-500, 500, 4).astype(np.int32),
    }
    model = one_node("QLinearConv", inputs, {"x"}, TensorProto.UINT8, attrs={"pads": [1, 1, 1, 1], "strides": [2, 2]})
    decomposed = decompose(model)
    # integer-valued operands, the int32 bias as integers, one requantising multiply (integer_exact tests)
    assert ops(decomposed) == ["DequantizeLinear", "DequantizeLinear", "Conv", "Mul", "QuantizeLinear"]
    weight_dq = list(decomposed.graph)[1]
    assert weight_dq.inputs[0].const_value.dtype == ir.DataType.INT8
    bias = list(decomposed.graph)[2].inputs[2]
    shift = -np.log2(weight_dq.inputs[1].const_value.numpy().reshape(-1)[0])
    np.testing.assert_array_equal(bias.const_value.numpy() * 2.0 ** shift, inputs["B"])
    assert decomposed.opset_imports[""] == 13  # the model's opset is left alone
    expected = ReferenceEvaluator(model).run(None, {"x": inputs["x"]})[0]
    actual = run_reference(decomposed, {"x": inputs["x"]})["y"]
    assert actual.dtype == np.uint8
    assert_within_one_step(actual, expected)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_matmul_matches_the_reference(dtype):
    inputs = {"a": ints((2, 3, 8), dtype, 3), "a_scale": np.float32(0.0311), "a_zero_point": np.array(5, dtype),
              "b": ints((8, 5), dtype, 4), "b_scale": np.float32(0.0077), "b_zero_point": np.array(2, dtype),
              "y_scale": np.float32(0.0913), "y_zero_point": np.array(10, dtype)}
    model = one_node("QLinearMatMul", inputs, {"a"}, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    decomposed = decompose(model)
    assert ops(decomposed) == ["DequantizeLinear", "DequantizeLinear", "MatMul", "Mul", "QuantizeLinear"]
    expected = ReferenceEvaluator(model).run(None, {"a": inputs["a"]})[0]
    assert_within_one_step(run_reference(decomposed, {"a": inputs["a"]})["y"], expected)


# -- com.microsoft ops against their documented formulas --------------------------------------------
def test_qlinear_add_follows_its_formula_with_broadcasting():
    a, b = ints((2, 3, 4), np.uint8, 5), ints((3, 1), np.uint8, 6)
    inputs = {"A": a, "A_scale": np.float32(0.041), "A_zero_point": np.uint8(128), "B": b, "B_scale": np.float32(0.029),
              "B_zero_point": np.uint8(100), "C_scale": np.float32(0.063), "C_zero_point": np.uint8(128)}
    model = one_node("QLinearAdd", inputs, {"A", "B"}, TensorProto.UINT8, domain=MS)
    real = 0.041 * (a.astype(np.float64) - 128) + 0.029 * (b.astype(np.float64) - 100)
    actual = run_reference(decompose(model), {"A": a, "B": b})["y"]
    assert_within_one_step(actual, requantize(real, 0.063, 128, np.uint8))


def test_qlinear_mul_without_zero_points_keeps_the_input_type():
    """Zero points are optional; QuantizeLinear without one would give uint8, so an int8 zero is supplied."""
    a, b = ints((8, 25), np.int8, 7), ints((8, 25), np.int8, 8)
    inputs = {"A": a, "A_scale": np.float32(0.0513), "A_zero_point": None, "B": b, "B_scale": np.float32(0.0297),
              "B_zero_point": None, "C_scale": np.float32(0.2111)}
    model = one_node("QLinearMul", inputs, {"A", "B"}, TensorProto.INT8, domain=MS)
    actual = run_reference(decompose(model), {"A": a, "B": b})["y"]
    assert actual.dtype == np.int8
    real = (np.float32(0.0513) * a.astype(np.float64)) * (np.float32(0.0297) * b)
    assert_within_one_step(actual, requantize(real, np.float32(0.2111), 0, np.int8))


@pytest.mark.parametrize("transpose_b", [0, 1])
def test_qgemm_scales_its_int32_c_by_alpha_and_both_input_scales(transpose_b):
    a, b = ints((3, 6), np.uint8, 9), ints((4, 6) if transpose_b else (6, 4), np.int8, 10)
    c = RNG.integers(-900, 900, 4).astype(np.int32)
    b_scale = np.linspace(0.01, 0.02, 4, dtype=np.float32)
    inputs = {"A": a, "a_scale": np.float32(0.02), "a_zero_point": np.uint8(120), "B": b, "b_scale": b_scale,
              "b_zero_point": np.zeros(4, np.int8), "C": c}
    model = one_node("QGemm", inputs, {"A"}, TensorProto.FLOAT, domain=MS, attrs={"alpha": 0.5, "transB": transpose_b})
    decomposed = decompose(model)
    weight_dq = list(decomposed.graph)[1]
    assert weight_dq.attributes["axis"].as_int() == 1  # per column of the product (B read as [K, N])
    product = (0.02 * (a.astype(np.float64) - 120)) @ ((b.T if transpose_b else b) * b_scale)
    expected = 0.5 * product + c * 0.5 * 0.02 * b_scale
    np.testing.assert_allclose(run_reference(decomposed, {"A": a})["y"], expected, rtol=1e-4, atol=1e-4)


def test_qlinear_concat_dequantises_each_input_with_its_own_parameters():
    x0, x1 = ints((1, 2, 3), np.uint8, 11), ints((1, 1, 3), np.uint8, 12)
    inputs = {"Y_scale": np.float32(0.05), "Y_zero_point": np.uint8(128), "x0": x0, "s0": np.float32(0.02),
              "z0": np.uint8(100), "x1": x1, "s1": np.float32(0.07), "z1": np.uint8(128)}
    model = one_node("QLinearConcat", inputs, {"x0", "x1"}, TensorProto.UINT8, domain=MS, attrs={"axis": 1})
    real = np.concatenate([0.02 * (x0.astype(np.float64) - 100), 0.07 * (x1.astype(np.float64) - 128)], axis=1)
    actual = run_reference(decompose(model), {"x0": x0, "x1": x1})["y"]
    assert_within_one_step(actual, requantize(real, 0.05, 128, np.uint8))


@pytest.mark.parametrize("op, attrs, reference", [
    ("QLinearSigmoid", {}, lambda v: 1 / (1 + np.exp(-v))),
    ("QLinearLeakyRelu", {"alpha": 0.25}, lambda v: np.where(v < 0, 0.25 * v, v)),
])
def test_qlinear_unary_ops(op, attrs, reference):
    x = ints((3, 30), np.int8, 13)
    inputs = {"X": x, "X_scale": np.float32(0.05), "X_zero_point": np.int8(3), "Y_scale": np.float32(0.0113),
              "Y_zero_point": np.int8(-10)}
    model = one_node(op, inputs, {"X"}, TensorProto.INT8, domain=MS, attrs=attrs)
    actual = run_reference(decompose(model), {"X": x})["y"]
    assert_within_one_step(actual, requantize(reference(0.05 * (x.astype(np.float64) - 3)), 0.0113, -10, np.int8))


@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_global_average_pool_in_either_layout(channels_last):
    x = ints((2, 4, 5, 3) if channels_last else (2, 3, 4, 5), np.uint8, 14)
    inputs = {"X": x, "x_scale": np.float32(0.03), "x_zero_point": np.uint8(128), "y_scale": np.float32(0.0107),
              "y_zero_point": np.uint8(128)}
    model = one_node("QLinearGlobalAveragePool", inputs, {"X"}, TensorProto.UINT8, domain=MS,
                     attrs={"channels_last": channels_last})
    axes = (1, 2) if channels_last else (2, 3)
    real = (0.03 * (x.astype(np.float64) - 128)).mean(axis=axes, keepdims=True)
    assert_within_one_step(run_reference(decompose(model), {"X": x})["y"], requantize(real, 0.0107, 128, np.uint8))


def test_qlinear_average_pool_keeps_its_window_attributes():
    x = ints((1, 2, 6, 6), np.uint8, 15)
    inputs = {"X": x, "x_scale": np.float32(0.03), "x_zero_point": np.uint8(128), "y_scale": np.float32(0.0213),
              "y_zero_point": np.uint8(128)}
    model = one_node("QLinearAveragePool", inputs, {"X"}, TensorProto.UINT8, domain=MS,
                     attrs={"kernel_shape": [2, 2], "strides": [2, 2]})
    decomposed = decompose(model)
    pool = next(node for node in decomposed.graph if node.op_type == "AveragePool")
    assert list(pool.attributes["kernel_shape"].as_ints()) == [2, 2]
    real = (0.03 * (x.astype(np.float64) - 128)).reshape(1, 2, 3, 2, 3, 2).mean(axis=(3, 5))
    assert_within_one_step(run_reference(decomposed, {"X": x})["y"], requantize(real, 0.0213, 128, np.uint8))


# -- in the optimise stage -------------------------------------------------------------------------
def test_the_optimise_stage_decomposes_before_folding_and_keeps_int8_weights(tmp_path):
    inputs = {"x": ints((1, 3, 8, 8), np.uint8, 16), "x_scale": np.float32(0.02), "x_zero_point": np.uint8(128),
              "w": ints((8, 3, 3, 3), np.int8, 17), "w_scale": np.full(8, 0.004, np.float32),
              "w_zero_point": np.zeros(8, np.int8), "y_scale": np.float32(0.05), "y_zero_point": np.uint8(128)}
    source = tmp_path / "m.onnx"
    onnx.save(one_node("QLinearConv", inputs, {"x"}, TensorProto.UINT8), source)
    report = optimize(source, tmp_path / "opt")
    assert report["rules"]["decompose_qoperator"] == 1
    assert report["op_counts_after"] == {"Conv": 1, "DequantizeLinear": 2, "Mul": 1, "QuantizeLinear": 1}
    assert report["quantization"] == {"activations": "keep", "activation_pairs_removed": 0, "weights_quantized": 1}
    out = ir.load(tmp_path / "opt" / "model.onnx")
    assert out.graph.outputs[0].name == "y"
    assert any(v.const_value.dtype == ir.DataType.INT8 and v.const_value.size == 216
               for v in out.graph.initializers.values())


def test_the_pass_is_registered_on_by_default_before_folding():
    from edgebuild.registry import build_registry

    entry = build_registry().tables["passes"]["decompose_qoperator"].obj
    assert entry.default and entry.before_folding
    implementation = DecomposeQOperator()
    assert (implementation.default, implementation.before_folding) == (True, True) and implementation.description


def test_a_malformed_node_is_named_in_the_error(tmp_path):
    inputs = {"Y_scale": np.float32(0.05), "Y_zero_point": np.uint8(128), "x0": ints((1, 2), np.uint8, 18),
              "s0": np.float32(0.02)}
    model = one_node("QLinearConcat", inputs, {"x0"}, TensorProto.UINT8, domain=MS, attrs={"axis": 1})
    with pytest.raises(QOperatorError, match=r"node 'q' \(com.microsoft::QLinearConcat\): expected \(tensor, scale"):
        DecomposeQOperator().apply(ir.serde.deserialize_model(model))
    source = tmp_path / "m.onnx"
    onnx.save(model, source)
    with pytest.raises(BuildError, match="decompose_qoperator") as info:
        optimize(source, tmp_path / "opt")
    assert "QLinearConcat" in str(info.value)
