"""QuantizeLinear and DequantizeLinear lowerings against onnxruntime; constant weights stay
compressed (lowering/ops/quant.py).

Each case builds a small ONNX model, lowers it to MIL, runs the program in edgebuild's MIL
interpreter and compares on the same random inputs.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest
from onnx_cases import IR_VERSION, assert_matches, check_op, lower, lower_and_run, rand, run_onnxruntime

RTOL, ATOL = 1e-4, 1e-5


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


def _int4_weight_model(signed: bool):
    import ml_dtypes

    rng = np.random.default_rng(3)
    dtype = ml_dtypes.int4 if signed else ml_dtypes.uint4
    low, high = (-8, 8) if signed else (0, 16)
    weight = rng.integers(low, high, (16, 6)).astype(dtype)
    zero = rng.integers(-2, 3, 6).astype(dtype) if signed else rng.integers(6, 10, 6).astype(dtype)
    deq = oh.make_node("DequantizeLinear", ["w", "s", "z"], ["wf"], axis=1)
    matmul = oh.make_node("MatMul", ["x", "wf"], ["y"])
    graph = oh.make_graph([deq, matmul], "g", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 16])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 6])],
                          [onh.from_array(weight, "w"), onh.from_array(rand(6, seed=4, low=0.01, high=0.1), "s"),
                           onh.from_array(zero, "z")])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21)], ir_version=IR_VERSION)


@pytest.mark.parametrize("signed", [True, False])
def test_int4_weight_stays_4_bit_in_the_saved_package_on_ios18(tmp_path, signed):
    from coremltools.converters.mil.mil import types

    from edgebuild_coreml.interpreter import load_mlpackage, run_mlpackage
    from edgebuild_coreml.lowering.package import save_mlpackage

    model = _int4_weight_model(signed)
    x = rand(3, 16, seed=5)
    expected = run_onnxruntime(model, {"x": x})["y"]
    result = lower(model, target="iOS18")
    assert result.op_counts.get("constexpr_blockwise_shift_scale") == 1 and not result.notes
    path = tmp_path / "model.mlpackage"
    save_mlpackage(result, path, target="iOS18", precision="float32", metadata={})
    saved = [op for op in load_mlpackage(path).functions["main"].operations
             if op.op_type == "constexpr_blockwise_shift_scale"]
    assert len(saved) == 1 and saved[0].data.dtype == (types.int4 if signed else types.uint4)
    assert_matches(next(iter(run_mlpackage(path, {"x": x}).values())), expected, rtol=RTOL, atol=ATOL)


def test_int4_weight_before_ios18_is_folded_with_a_note():
    model = _int4_weight_model(True)
    result = lower(model, target="iOS17")
    assert not any(op.startswith("constexpr") for op in result.op_counts)
    assert len(result.notes) == 1 and "iOS18" in result.notes[0] and "4-bit" in result.notes[0]
    x = rand(3, 16, seed=5)
    assert_matches(lower_and_run(model, {"x": x}, target="iOS17")["y"], run_onnxruntime(model, {"x": x})["y"],
                   rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("dtype", [np.uint16, np.int16])
def test_sixteen_bit_activation_pair_round_trips(dtype):
    """A QDQ pair at 16 bits (quantize_static's QUInt16/QInt16 activations) on a runtime tensor."""
    zero = dtype(30000 if dtype == np.uint16 else -7)
    q = oh.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"])
    dq = oh.make_node("DequantizeLinear", ["xq", "s", "z"], ["y"])
    graph = oh.make_graph([q, dq], "g", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 50])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 50])],
                          [onh.from_array(np.array(0.0003, np.float32), "s"), onh.from_array(np.array(zero), "z")])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21)], ir_version=IR_VERSION)
    x = rand(4, 50, seed=6, low=-12, high=12)
    assert_matches(lower_and_run(model, {"x": x})["y"], run_onnxruntime(model, {"x": x})["y"], rtol=RTOL, atol=ATOL)
