"""Quantised matmuls and convolutions decompose into integer-exact float arithmetic
(edgebuild.graph.quantized.integer, used by the dynamic and QOperator passes).

No onnxruntime here: the expected values are onnxruntime's integer kernels written in numpy
(an int32 sum, converted to float32 once, times the scale product; QLinear ops requantise with
``nearbyint(float(sum + bias) * (x_scale * w_scale / y_scale)) + y_zero_point``, saturated), and
the rewritten graphs, run by onnx's reference evaluator, must equal them bit for bit. The Core ML
plugin's test_real_quantized_exact checks the same against onnxruntime itself on real models.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnx_ir as ir
import pytest

from edgebuild.graph.fused_reference import run_reference
from edgebuild.graph.quantized import integer
from edgebuild.graph.quantized.dynamic import PASS as DYNAMIC
from edgebuild.graph.quantized.qoperator import PASS as QOPERATOR

F, U8, I8 = onnx.TensorProto.FLOAT, onnx.TensorProto.UINT8, onnx.TensorProto.INT8
MS = "com.microsoft"
RNG = np.random.default_rng(7)


def _model(nodes, inputs, initializers, opset=13, ms=False) -> onnx.ModelProto:
    graph = oh.make_graph(nodes, "case", inputs, [oh.make_tensor_value_info("y", F, None)],
                          [onh.from_array(np.asarray(v), k) for k, v in initializers.items()])
    graph.output[0].type.tensor_type.elem_type = 0  # the output's type is the rewrite's business
    opsets = [oh.make_opsetid("", opset)] + ([oh.make_opsetid(MS, 1)] if ms else [])
    return oh.make_model(graph, opset_imports=opsets, ir_version=9)


def _rewritten(model: onnx.ModelProto, graph_pass) -> ir.Model:
    rewritten = ir.serde.deserialize_model(model)
    assert graph_pass.apply(rewritten) == 1
    return rewritten


def _ops(model: ir.Model) -> list[str]:
    return [node.op_type for node in model.graph]


def _weights(shape, dtype, seed):
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, info.max + 1, shape).astype(dtype)


def _dynamic_quantize(x: np.ndarray):
    """onnxruntime's DynamicQuantizeLinear (uint8; the range includes 0)."""
    low, high = np.float32(min(x.min(), 0)), np.float32(max(x.max(), 0))
    scale = np.float32((high - low) / np.float32(255))
    zero = np.float32(np.clip(np.rint(np.float32(0) - low / scale), 0, 255))
    return np.clip(np.rint(x / scale) + zero, 0, 255).astype(np.int64), scale, zero.astype(np.int64)


def _int32_matmul(a, b) -> np.ndarray:
    return np.matmul(a.astype(np.int64), b.astype(np.int64))


# -- quantize_dynamic's MatMulInteger / ConvInteger -> Cast -> Mul --------------------------------

@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_matmul_integer_chain_is_onnxruntimes_arithmetic_bit_for_bit(dtype, per_channel):
    k, n = 96, 10
    w = _weights((k, n), dtype, 1)
    w_scale = (RNG.uniform(0.001, 0.01, n) if per_channel else np.array(0.004)).astype(np.float32)
    w_zero = (RNG.integers(0, 40, n) if per_channel else np.array(0 if dtype == np.int8 else 131)).astype(dtype)
    bias = RNG.normal(size=n).astype(np.float32)
    nodes = [oh.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "x_scale", "x_zp"]),
             oh.make_node("Mul", ["w_scale", "x_scale"], ["scale"]),
             oh.make_node("MatMulInteger", ["x_q", "w", "x_zp", "w_zp"], ["acc"]),
             oh.make_node("Cast", ["acc"], ["acc_f"], to=F), oh.make_node("Mul", ["acc_f", "scale"], ["scaled"]),
             oh.make_node("Add", ["scaled", "bias"], ["y"])]
    model = _model(nodes, [oh.make_tensor_value_info("x", F, [2, 3, k])],
                   {"w": w, "w_scale": w_scale, "w_zp": w_zero, "bias": bias})
    rewritten = _rewritten(model, DYNAMIC)
    assert "MatMulInteger" not in _ops(rewritten) and "Cast" not in _ops(rewritten)
    weight = next(n for n in rewritten.graph if n.op_type == "DequantizeLinear" and n.inputs[0].name == "w")
    assert weight.inputs[0].const_value.dtype == ir.DataType.from_numpy(np.dtype(dtype))  # kept 8-bit

    x = (RNG.normal(size=(2, 3, k)) * 3).astype(np.float32)
    q, x_scale, x_zero = _dynamic_quantize(x)
    acc = _int32_matmul(q - x_zero, w.astype(np.int64) - w_zero.astype(np.int64))
    expected = acc.astype(np.float32) * (w_scale * x_scale) + bias
    np.testing.assert_array_equal(run_reference(rewritten, {"x": x})["y"], expected)


@pytest.mark.parametrize("group", [1, 4])
def test_conv_integer_chain_is_exact(group):
    c, m = 8, 8
    w = _weights((m, c // group, 3, 3), np.uint8, 2)
    w_zero = np.array(120, np.uint8)
    nodes = [oh.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "x_scale", "x_zp"]),
             oh.make_node("Mul", ["x_scale", "w_scale"], ["scale"]),
             oh.make_node("ConvInteger", ["x_q", "w", "x_zp", "w_zp"], ["acc"], pads=[1, 1, 1, 1], strides=[2, 1],
                          group=group),
             oh.make_node("Cast", ["acc"], ["acc_f"], to=F), oh.make_node("Mul", ["acc_f", "scale"], ["y"])]
    model = _model(nodes, [oh.make_tensor_value_info("x", F, [1, c, 9, 9])],
                   {"w": w, "w_scale": np.array(0.003, np.float32), "w_zp": w_zero})
    rewritten = _rewritten(model, DYNAMIC)
    [conv] = [n for n in rewritten.graph if n.op_type == "Conv"]
    assert conv.attributes["group"].as_int() == group
    x = RNG.normal(size=(1, c, 9, 9)).astype(np.float32)
    [expected] = onnx.reference.ReferenceEvaluator(model).run(None, {"x": x})  # integer ops: exact int32
    np.testing.assert_array_equal(run_reference(rewritten, {"x": x})["y"], expected)


def test_a_matmul_of_two_runtime_tensors_is_exact():
    """Attention's Q @ K^T, both sides quantised at run time."""
    nodes = [oh.make_node("DynamicQuantizeLinear", ["a"], ["a_q", "a_scale", "a_zp"]),
             oh.make_node("DynamicQuantizeLinear", ["b"], ["b_q", "b_scale", "b_zp"]),
             oh.make_node("Mul", ["a_scale", "b_scale"], ["scale"]),
             oh.make_node("MatMulInteger", ["a_q", "b_q", "a_zp", "b_zp"], ["acc"]),
             oh.make_node("Cast", ["acc"], ["acc_f"], to=F), oh.make_node("Mul", ["acc_f", "scale"], ["y"])]
    model = _model(nodes, [oh.make_tensor_value_info("a", F, [2, 16, 64]), oh.make_tensor_value_info("b", F, [2, 64, 16])],
                   {})
    rewritten = _rewritten(model, DYNAMIC)
    feeds = {"a": RNG.normal(size=(2, 16, 64)).astype(np.float32), "b": RNG.normal(size=(2, 64, 16)).astype(np.float32)}
    [expected] = onnx.reference.ReferenceEvaluator(model).run(None, feeds)
    np.testing.assert_array_equal(run_reference(rewritten, feeds)["y"], expected)
    # the fp16 shift: 255 * 255 * 64 per sum is beyond fp16; the shifted worst case is not
    shift = integer.shift_for(255 * 255 * 64)
    assert shift > 0 and 255 * 255 * 64 * 2.0 ** -shift <= integer.FP16_HEADROOM


def test_a_long_contraction_is_split_where_a_sum_could_pass_2_24():
    k, n = 1200, 4
    w = np.full((k, n), 255, np.uint8)  # zero point 0: every step adds up to 255 * 255
    w[::7] = RNG.integers(0, 256, (len(w[::7]), n))
    nodes = [oh.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "x_scale", "x_zp"]),
             oh.make_node("Mul", ["x_scale", "w_scale"], ["scale"]),
             oh.make_node("MatMulInteger", ["x_q", "w", "x_zp"], ["acc"]),
             oh.make_node("Cast", ["acc"], ["acc_f"], to=F), oh.make_node("Mul", ["acc_f", "scale"], ["y"])]
    model = _model(nodes, [oh.make_tensor_value_info("x", F, [3, k])], {"w": w, "w_scale": np.array(0.01, np.float32)})
    rewritten = _rewritten(model, DYNAMIC)
    steps = integer.contraction_sums(w, None, conv=False)
    runs = integer.chunks(steps, integer.EIGHT_BIT_SPAN)
    assert len(runs) == _ops(rewritten).count("MatMul") == 5  # about 258 steps of 255 * 255 below 2**24
    assert all(integer.EIGHT_BIT_SPAN * steps[start:end].sum() < integer.EXACT_LIMIT for start, end in runs)
    x = RNG.uniform(-1, 1, (3, k)).astype(np.float32)  # sums well below 2**24: exact however they are split
    [expected] = onnx.reference.ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_array_equal(run_reference(rewritten, {"x": x})["y"], expected)


# -- com.microsoft matmuls ----------------------------------------------------------------------

def test_dynamic_quantize_matmul_and_matmul_integer_to_float_scale_once():
    k, n = 40, 6
    b = _weights((k, n), np.int8, 3)
    b_scale = RNG.uniform(0.001, 0.01, n).astype(np.float32)
    bias = RNG.normal(size=n).astype(np.float32)
    dqm = _model([oh.make_node("DynamicQuantizeMatMul", ["a", "b", "bs", "", "bias"], ["y"], domain=MS)],
                 [oh.make_tensor_value_info("a", F, [5, k])], {"b": b, "bs": b_scale, "bias": bias}, ms=True)
    a = RNG.normal(size=(5, k)).astype(np.float32)
    q, a_scale, a_zero = _dynamic_quantize(a)
    expected = _int32_matmul(q - a_zero, b).astype(np.float32) * (a_scale * b_scale) + bias
    np.testing.assert_array_equal(run_reference(_rewritten(dqm, DYNAMIC), {"a": a})["y"], expected)

    a_q = RNG.integers(0, 256, (5, k)).astype(np.uint8)
    mitf = _model([oh.make_node("MatMulIntegerToFloat", ["a", "b", "as", "bs", "az"], ["y"], domain=MS)],
                  [oh.make_tensor_value_info("a", U8, [5, k])],
                  {"b": b, "as": np.array(0.02, np.float32), "bs": b_scale, "az": np.array(100, np.uint8)}, ms=True)
    expected = _int32_matmul(a_q.astype(np.int64) - 100, b).astype(np.float32) * (np.float32(0.02) * b_scale)
    np.testing.assert_array_equal(run_reference(_rewritten(mitf, DYNAMIC), {"a": a_q})["y"], expected)


# -- QLinearConv / QLinearMatMul: one requantisation, as onnxruntime's kernels ----------------------

def _requantized(acc: np.ndarray, multiplier: np.ndarray, zero: int, dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.clip(np.rint(acc.astype(np.float32) * multiplier) + zero, info.min, info.max).astype(dtype)


def _conv_int(x, w, pads, group):
    """The int64 convolution sum (stride 1), per group."""
    x = np.pad(x.astype(np.int64), [(0, 0), (0, 0), (pads, pads), (pads, pads)])
    m, cg, kh, kw = w.shape
    out = np.zeros((x.shape[0], m, x.shape[2] - kh + 1, x.shape[3] - kw + 1), np.int64)
    per_group = m // group
    for o in range(m):
        g = o // per_group
        for i in range(kh):
            for j in range(kw):
                window = x[:, g * cg:(g + 1) * cg, i:i + out.shape[2], j:j + out.shape[3]]
                out[:, o] += np.einsum("nchw,c->nhw", window, w[o, :, i, j].astype(np.int64))
    return out


@pytest.mark.parametrize("weight_type,per_channel,group", [
    (np.int8, True, 1), (np.int8, False, 2), (np.uint8, False, 1), (np.uint8, True, 1)])
def test_qlinear_conv_is_onnxruntimes_requantisation_bit_for_bit(weight_type, per_channel, group):
    c, m = 6, 4
    w = _weights((m, c // group, 3, 3), weight_type, 4)
    w_scale = (RNG.uniform(0.001, 0.01, m) if per_channel else np.array(0.004)).astype(np.float32)
    w_zero = np.zeros(m, weight_type) if per_channel else np.array(0 if weight_type == np.int8 else 125, weight_type)
    bias = RNG.integers(-3000, 3000, m).astype(np.int32)
    params = {"xs": np.array(0.0213, np.float32), "xz": np.array(128, np.uint8), "w": w, "ws": w_scale, "wz": w_zero,
              "ys": np.array(0.0517, np.float32), "yz": np.array(120, np.uint8), "b": bias}
    node = oh.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"], pads=[1, 1, 1, 1],
                        group=group)
    model = _model([node], [oh.make_tensor_value_info("x", U8, [1, c, 7, 7])], params)
    rewritten = _rewritten(model, QOPERATOR)
    assert _ops(rewritten) == ["DequantizeLinear", "DequantizeLinear", "Conv", "Mul", "QuantizeLinear"]
    x = _weights((1, c, 7, 7), np.uint8, 5)
    acc = _conv_int(x.astype(np.int64) - 128, w.astype(np.int64) - np.asarray(w_zero, np.int64).reshape(-1, 1, 1, 1)
                    if per_channel else w.astype(np.int64) - int(w_zero), 1, group) + bias.reshape(-1, 1, 1)
    multiplier = (np.float32(0.0213) * w_scale / np.float32(0.0517)).astype(np.float32).reshape(-1, 1, 1)
    np.testing.assert_array_equal(run_reference(rewritten, {"x": x})["y"], _requantized(acc, multiplier, 120, np.uint8))


@pytest.mark.parametrize("per_column", [False, True])
def test_qlinear_matmul_is_onnxruntimes_requantisation_bit_for_bit(per_column):
    k, n = 48, 5
    b = _weights((k, n), np.int8, 6)
    b_scale = (RNG.uniform(0.001, 0.01, n) if per_column else np.array(0.0077)).astype(np.float32)
    params = {"as": np.array(0.0311, np.float32), "az": np.array(5, np.uint8), "b": b, "bs": b_scale,
              "bz": np.zeros(n, np.int8) if per_column else np.array(0, np.int8),
              "ys": np.array(0.0913, np.float32), "yz": np.array(10, np.uint8)}
    node = oh.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    model = _model([node], [oh.make_tensor_value_info("a", U8, [2, 3, k])], params)
    a = _weights((2, 3, k), np.uint8, 7)
    acc = _int32_matmul(a.astype(np.int64) - 5, b)
    multiplier = (np.float32(0.0311) * b_scale / np.float32(0.0913)).astype(np.float32)
    got = run_reference(_rewritten(model, QOPERATOR), {"a": a})["y"]
    np.testing.assert_array_equal(got, _requantized(acc, multiplier, 10, np.uint8))


def test_a_computed_scale_keeps_the_float_form():
    """A runtime y_scale cannot give the multiplier as a constant: the dequantised form stays."""
    params = {"xs": np.array(0.02, np.float32), "xz": np.array(128, np.uint8), "w": _weights((4, 3, 1, 1), np.int8, 8),
              "ws": np.array(0.004, np.float32), "yz": np.array(128, np.uint8)}
    node = oh.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "", "ys", "yz"], ["y"])
    model = _model([node], [oh.make_tensor_value_info("x", U8, [1, 3, 4, 4]), oh.make_tensor_value_info("ys", F, [])],
                   params)
    assert _ops(_rewritten(model, QOPERATOR)) == ["DequantizeLinear", "DequantizeLinear", "Conv", "QuantizeLinear"]


@pytest.mark.parametrize("trans_b,requantized", [(0, True), (1, True), (1, False)])
def test_qgemm_scales_by_alpha_a_and_b_once(trans_b, requantized):
    """com.microsoft QGemm: C joins the int32 sum; the scale is alpha * a_scale * b_scale [/ y_scale]."""
    k, n = 32, 6
    b = _weights((n, k) if trans_b else (k, n), np.int8, 9)
    b_scale = RNG.uniform(0.001, 0.01, n).astype(np.float32)
    c = RNG.integers(-3000, 3000, n).astype(np.int32)
    params = {"as": np.array(0.02, np.float32), "az": np.array(120, np.uint8), "b": b, "bs": b_scale,
              "bz": np.zeros(n, np.int8), "c": c}
    names = ["a", "as", "az", "b", "bs", "bz", "c"]
    if requantized:
        params.update(ys=np.array(0.3, np.float32), yz=np.array(110, np.uint8))
        names += ["ys", "yz"]
    node = oh.make_node("QGemm", names, ["y"], domain=MS, transB=trans_b, alpha=0.7)
    model = _model([node], [oh.make_tensor_value_info("a", U8, [5, k])], params, ms=True)
    a = _weights((5, k), np.uint8, 10)
    acc = _int32_matmul(a.astype(np.int64) - 120, b.T if trans_b else b) + c
    scale = (np.float32(0.7) * np.float32(0.02) * b_scale).astype(np.float32)
    got = run_reference(_rewritten(model, QOPERATOR), {"a": a})["y"]
    if requantized:
        np.testing.assert_array_equal(got, _requantized(acc, (scale / np.float32(0.3)).astype(np.float32), 110, np.uint8))
    else:
        np.testing.assert_array_equal(got, acc.astype(np.float32) * scale)


@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_global_average_pool_sums_integers_and_requantises_once(channels_last):
    """onnxruntime's kernel: sum(x - x_zero_point) * (x_scale / (y_scale * image size)), rounded once."""
    shape = [2, 5, 5, 6] if channels_last else [2, 6, 5, 5]
    params = {"xs": np.array(0.021, np.float32), "xz": np.array(100, np.uint8), "ys": np.array(0.013, np.float32),
              "yz": np.array(90, np.uint8)}
    node = oh.make_node("QLinearGlobalAveragePool", ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS,
                        channels_last=channels_last)
    model = _model([node], [oh.make_tensor_value_info("x", U8, shape)], params, ms=True)
    rewritten = _rewritten(model, QOPERATOR)
    assert _ops(rewritten) == ["DequantizeLinear", "ReduceSum", "Mul", "QuantizeLinear"]
    x = _weights(shape, np.uint8, 11)
    axes = (1, 2) if channels_last else (2, 3)
    acc = (x.astype(np.int64) - 100).sum(axis=axes, keepdims=True)
    multiplier = (np.float32(0.021) / (np.float32(0.013) * np.float32(25))).astype(np.float32)
    np.testing.assert_array_equal(run_reference(rewritten, {"x": x})["y"], _requantized(acc, multiplier, 90, np.uint8))
