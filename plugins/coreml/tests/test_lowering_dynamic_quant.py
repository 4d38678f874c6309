"""quantize_dynamic's ops through the decomposition pass and the Core ML lowering, against onnxruntime.

Each case is a one-op float model quantised by onnxruntime's own ``quantize_dynamic`` (MatMul ->
MatMulInteger, Conv -> ConvInteger, LSTM -> com.microsoft DynamicQuantizeLSTM), or a
com.microsoft DynamicQuantizeMatMul / MatMulIntegerToFloat node written from onnxruntime's
contrib-op documentation. It runs through the optimise stage (edgebuild.graph.optimize, whose
decompose_dynamic_quant pass rewrites it to DequantizeLinear + float ops), is lowered to MIL and
run in the MIL interpreter; onnxruntime runs the quantised source.

Tolerance: the matmul and conv forms sum integer-valued operands and scale once, as onnxruntime's
integer kernels do, and are held to onnxruntime's result exactly (a step of 0). The LSTM forms
dequantise before they multiply, so float rounding differs in the last bits; where a run-time
quantised value lies that close to a rounding boundary, it lands one quantisation step away.
They are held to cosine >= 0.9999 and a max-abs error of at most 3 such steps (one activation
step times the largest weight, per product).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest
from onnx.reference import ReferenceEvaluator
from onnx_cases import INT8_EXACT_RANGE, IR_VERSION, int8_weights, lower, lower_and_run, run_onnxruntime

from edgebuild.graph.optimize import optimize

F = onnx.TensorProto.FLOAT
RNG = np.random.default_rng(0)


def _float_model(nodes, inputs, outputs, initializers, opset=17):
    graph = oh.make_graph(nodes, "case", inputs, outputs, initializers)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], ir_version=IR_VERSION)


def _quantize(tmp_path: Path, model: onnx.ModelProto, **options) -> onnx.ModelProto:
    """``quantize_dynamic`` with 7-bit weights, which onnxruntime computes exactly on every CPU
    (onnx_cases.INT8_EXACT_RANGE)."""
    from onnxruntime.quantization import quantize_dynamic

    options.setdefault("reduce_range", True)
    src, dst = tmp_path / "float.onnx", tmp_path / "quantized.onnx"
    onnx.save(model, src)
    quantize_dynamic(src, dst, **options)
    return onnx.load(dst)


def _optimised(tmp_path: Path, model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict]:
    path = tmp_path / "source.onnx"
    onnx.save(model, path)
    report = optimize(path, tmp_path / "optimised")
    return onnx.load(tmp_path / "optimised" / "model.onnx"), report


def _cosine(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _check(tmp_path, source: onnx.ModelProto, feeds: dict, step: float, *, precision="float32", cosine=0.9999):
    """Build ``source`` as edgebuild would; compare with onnxruntime on ``source``. Returns the optimise report."""
    optimised, report = _optimised(tmp_path, source)
    expected = run_onnxruntime(source, feeds)
    actual = lower_and_run(optimised, feeds, precision=precision)
    for name, reference in expected.items():
        got = actual[name]
        assert got.shape == reference.shape, name
        assert np.isfinite(got).all(), name
        assert _cosine(got, reference) >= cosine, f"{name}: cosine {_cosine(got, reference)}"
        assert np.abs(got.astype(np.float64) - reference).max() <= 3 * step, name
    return optimised, report


def _ops(model: onnx.ModelProto) -> set[str]:
    return {n.op_type for n in model.graph.node}


def _program_ops(model: onnx.ModelProto) -> list[str]:
    return [op.op_type for op in lower(model).program.functions["main"].operations]


# -- MatMulInteger ------------------------------------------------------------------------------

@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize("weight_type", ["QInt8", "QUInt8"])
def test_matmul_integer_from_quantize_dynamic(tmp_path, per_channel, weight_type):
    from onnxruntime.quantization import QuantType

    w = RNG.normal(size=(32, 24)).astype(np.float32)
    bias = RNG.normal(size=24).astype(np.float32)
    model = _float_model(
        [oh.make_node("MatMul", ["x", "w"], ["mm"]), oh.make_node("Add", ["mm", "b"], ["y"])],
        [oh.make_tensor_value_info("x", F, [3, 5, 32])], [oh.make_tensor_value_info("y", F, [3, 5, 24])],
        [onh.from_array(w, "w"), onh.from_array(bias, "b")])
    source = _quantize(tmp_path, model, per_channel=per_channel, weight_type=getattr(QuantType, weight_type))
    assert "MatMulInteger" in _ops(source)
    x = RNG.normal(size=(3, 5, 32)).astype(np.float32)
    optimised, report = _check(tmp_path, source, {"x": x}, 0)  # integer-exact: onnxruntime's result itself
    assert report["rules"]["decompose_dynamic_quant"] == 1
    assert "MatMulInteger" not in _ops(optimised)
    # the weight stays int8/uint8 behind a constexpr op, the activation is quantised in the program
    ops = _program_ops(optimised)
    assert "constexpr_blockwise_shift_scale" in ops and "round" in ops


def test_matmul_integer_fp16_stays_finite(tmp_path):
    """Large activations: an int32 sum of quantised values would overflow fp16; the float products do not."""
    w = RNG.normal(size=(256, 16)).astype(np.float32)
    model = _float_model([oh.make_node("MatMul", ["x", "w"], ["y"])], [oh.make_tensor_value_info("x", F, [4, 256])],
                         [oh.make_tensor_value_info("y", F, [4, 16])], [onh.from_array(w, "w")])
    source = _quantize(tmp_path, model)
    x = (RNG.normal(size=(4, 256)) * 50).astype(np.float32)
    optimised, _ = _optimised(tmp_path, source)
    got = lower_and_run(optimised, {"x": x}, precision="float16")["y"]
    expected = run_onnxruntime(source, {"x": x})["y"]
    assert np.isfinite(got).all()
    assert _cosine(got, expected) >= 0.999  # fp16's own resolution


def test_matmul_integer_read_some_other_way_keeps_the_integer_lowering(tmp_path):
    """MatMulInteger whose int32 result is an output: left alone, lowered as ONNX specifies."""
    a = RNG.integers(0, 255, (3, 8)).astype(np.uint8)
    b = int8_weights((8, 4), seed=1)
    model = oh.make_model(oh.make_graph(
        [oh.make_node("MatMulInteger", ["a", "b", "az"], ["y"])], "case",
        [oh.make_tensor_value_info("a", onnx.TensorProto.UINT8, [3, 8])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.INT32, [3, 4])],
        [onh.from_array(b, "b"), onh.from_array(np.array(7, np.uint8), "az")]),
        opset_imports=[oh.make_opsetid("", 13)], ir_version=IR_VERSION)
    optimised, report = _optimised(tmp_path, model)
    assert report["rules"]["decompose_dynamic_quant"] == 0 and "MatMulInteger" in _ops(optimised)
    got = lower_and_run(optimised, {"a": a})["y"]
    np.testing.assert_array_equal(got, run_onnxruntime(model, {"a": a})["y"])


# -- ConvInteger --------------------------------------------------------------------------------

@pytest.mark.parametrize("weight_type", ["QInt8", "QUInt8"])
def test_conv_integer_from_quantize_dynamic(tmp_path, weight_type):
    from onnxruntime.quantization import QuantType

    w = RNG.normal(size=(6, 3, 3, 3)).astype(np.float32)
    bias = RNG.normal(size=6).astype(np.float32)
    model = _float_model(
        [oh.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])],
        [oh.make_tensor_value_info("x", F, [1, 3, 9, 9])], [oh.make_tensor_value_info("y", F, [1, 6, 5, 5])],
        [onh.from_array(w, "w"), onh.from_array(bias, "b")])
    source = _quantize(tmp_path, model, weight_type=getattr(QuantType, weight_type))
    assert "ConvInteger" in _ops(source)
    x = RNG.normal(size=(1, 3, 9, 9)).astype(np.float32)
    optimised, report = _check(tmp_path, source, {"x": x}, 0)  # integer-exact
    assert report["rules"]["decompose_dynamic_quant"] == 1 and "ConvInteger" not in _ops(optimised)
    assert "constexpr_blockwise_shift_scale" in _program_ops(optimised)


def test_conv_integer_per_channel_zero_point_is_lowered_exactly():
    """The fallback lowering: ConvInteger's int32 result with a per-output-channel weight zero point
    (onnxruntime's kernel takes per-tensor zero points only: onnx's reference evaluator judges)."""
    x = RNG.integers(0, 255, (1, 2, 6, 6)).astype(np.uint8)
    w = RNG.integers(0, 255, (4, 2, 3, 3)).astype(np.uint8)
    model = oh.make_model(oh.make_graph(
        [oh.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=[1, 0, 1, 0])], "case",
        [oh.make_tensor_value_info("x", onnx.TensorProto.UINT8, [1, 2, 6, 6])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.INT32, None)],
        [onh.from_array(w, "w"), onh.from_array(np.array(9, np.uint8), "xz"),
         onh.from_array(np.array([3, 120, 0, 255], np.uint8), "wz")]),
        opset_imports=[oh.make_opsetid("", 13)], ir_version=IR_VERSION)
    model = onnx.shape_inference.infer_shapes(model)
    got = lower_and_run(model, {"x": x})["y"]
    np.testing.assert_array_equal(got, ReferenceEvaluator(model).run(None, {"x": x})[0])


# -- com.microsoft DynamicQuantizeMatMul / MatMulIntegerToFloat --------------------------------

def _contrib_model(node, inputs, initializers, out_shape):
    graph = oh.make_graph([node], "case", inputs, [oh.make_tensor_value_info("y", F, out_shape)], initializers)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("com.microsoft", 1)],
                         ir_version=IR_VERSION)


@pytest.mark.parametrize("with_zero_point,with_bias", [(False, False), (True, True)], ids=["plain", "zero_point_bias"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_dynamic_quantize_matmul(tmp_path, dtype, with_zero_point, with_bias):
    """Y = dequantise(dynamic_quantize(A)) @ (B - b_zero_point) * b_scale [+ bias] (ContribOperators.md)."""
    low, high = INT8_EXACT_RANGE if dtype == np.int8 else (0, 256)
    b = RNG.integers(low, high, (16, 8)).astype(dtype)
    inits = [onh.from_array(b, "b"), onh.from_array(np.array(0.02, np.float32), "b_scale")]
    names = ["a", "b", "b_scale"]
    if with_zero_point:
        inits.append(onh.from_array(np.array(3 if dtype == np.int8 else 130, dtype), "b_zp"))
        names.append("b_zp")
    if with_bias:
        inits.append(onh.from_array(RNG.normal(size=8).astype(np.float32), "bias"))
        names += [""] * (4 - len(names)) + ["bias"]
    node = oh.make_node("DynamicQuantizeMatMul", names, ["y"], domain="com.microsoft")
    model = _contrib_model(node, [oh.make_tensor_value_info("a", F, [2, 6, 16])], inits, [2, 6, 8])
    a = RNG.normal(size=(2, 6, 16)).astype(np.float32)
    optimised, report = _check(tmp_path, model, {"a": a}, 0)  # integer-exact
    assert report["rules"]["decompose_dynamic_quant"] == 1 and "DynamicQuantizeMatMul" not in _ops(optimised)


@pytest.mark.parametrize("per_column", [False, True], ids=["per_tensor", "per_column"])
def test_matmul_integer_to_float(tmp_path, per_column):
    """Y = (A - a_zero_point) * a_scale @ (B - b_zero_point) * b_scale + bias, A quantised at run time."""
    b = int8_weights((16, 8), seed=2)
    b_scale = (RNG.uniform(0.01, 0.03, 8) if per_column else np.array(0.02)).astype(np.float32)
    inits = [onh.from_array(b, "b"), onh.from_array(b_scale, "b_scale"),
             onh.from_array(np.array(0.05, np.float32), "a_scale"), onh.from_array(np.array(100, np.uint8), "a_zp"),
             onh.from_array(RNG.normal(size=8).astype(np.float32), "bias")]
    node = oh.make_node("MatMulIntegerToFloat", ["a", "b", "a_scale", "b_scale", "a_zp", "", "bias"], ["y"],
                        domain="com.microsoft")
    model = _contrib_model(node, [oh.make_tensor_value_info("a", onnx.TensorProto.UINT8, [4, 16])], inits, [4, 8])
    a = RNG.integers(0, 256, (4, 16)).astype(np.uint8)
    try:
        run_onnxruntime(model, {"a": a})
    except Exception as exc:  # noqa: BLE001 - older onnxruntime kernels take per-tensor scales only
        pytest.skip(f"this onnxruntime refuses the case: {exc}")
    optimised, _ = _check(tmp_path, model, {"a": a}, 0)  # integer-exact
    assert "MatMulIntegerToFloat" not in _ops(optimised)


# -- DynamicQuantizeLSTM ------------------------------------------------------------------------

def _lstm_model(hidden: int, direction: str, steps: int, batch: int, features: int, peephole: bool):
    dirs = 2 if direction == "bidirectional" else 1
    inits = [onh.from_array(RNG.normal(scale=0.5, size=(dirs, 4 * hidden, features)).astype(np.float32), "w"),
             onh.from_array(RNG.normal(scale=0.5, size=(dirs, 4 * hidden, hidden)).astype(np.float32), "r"),
             onh.from_array(RNG.normal(scale=0.5, size=(dirs, 8 * hidden)).astype(np.float32), "b")]
    names = ["x", "w", "r", "b", "", "h0", "c0"]
    if peephole:
        inits.append(onh.from_array(RNG.normal(scale=0.5, size=(dirs, 3 * hidden)).astype(np.float32), "p"))
        names.append("p")
    node = oh.make_node("LSTM", names, ["y", "y_h", "y_c"], hidden_size=hidden, direction=direction)
    return _float_model(
        [node],
        [oh.make_tensor_value_info("x", F, [steps, batch, features]),
         oh.make_tensor_value_info("h0", F, [dirs, batch, hidden]), oh.make_tensor_value_info("c0", F, [dirs, batch, hidden])],
        [oh.make_tensor_value_info(n, F, None) for n in ("y", "y_h", "y_c")], inits)


@pytest.mark.parametrize("direction,per_channel,peephole", [
    ("forward", False, False), ("reverse", True, False), ("bidirectional", False, True)])
def test_dynamic_quantize_lstm(tmp_path, direction, per_channel, peephole):
    """Input and every step's hidden state quantised at run time, as onnxruntime's kernel does (batch 1)."""
    hidden, steps, batch, features = 8, 6, 1, 5
    model = _lstm_model(hidden, direction, steps, batch, features, peephole)
    source = _quantize(tmp_path, model, per_channel=per_channel, op_types_to_quantize=["LSTM"])
    assert "DynamicQuantizeLSTM" in _ops(source)
    dirs = 2 if direction == "bidirectional" else 1
    feeds = {"x": RNG.normal(size=(steps, batch, features)).astype(np.float32),
             "h0": RNG.uniform(-0.5, 0.5, (dirs, batch, hidden)).astype(np.float32),
             "c0": RNG.uniform(-0.5, 0.5, (dirs, batch, hidden)).astype(np.float32)}
    # a flipped step moves a gate pre-activation by about one step times a weight; the gates damp it
    optimised, report = _check(tmp_path, source, feeds, 0.01)
    assert report["rules"]["decompose_dynamic_quant"] == 1
    assert "DynamicQuantizeLSTM" not in {n.op_type for n in optimised.graph.node}
    assert _program_ops(optimised).count("constexpr_blockwise_shift_scale") == 2 * dirs


def test_dynamic_quantize_lstm_from_zero_state(tmp_path):
    """No initial state: step 0 quantises an all-zero hidden state (scale 1, as onnxruntime takes it)."""
    hidden, steps, features = 6, 4, 3
    model = _lstm_model(hidden, "forward", steps, 1, features, False)
    model.graph.node[0].input[5] = ""
    model.graph.node[0].input[6] = ""
    del model.graph.input[1:]
    source = _quantize(tmp_path, model, op_types_to_quantize=["LSTM"])
    feeds = {"x": RNG.normal(size=(steps, 1, features)).astype(np.float32)}
    _check(tmp_path, source, feeds, 0.01)


RUNTIME_QUANT_NOTE = "the graph quantises at run time (DynamicQuantizeLinear) values that float ops"


@pytest.mark.parametrize("first", ["LayerNormalization", "Add"])
def test_run_time_quantisation_after_implementation_rounded_ops_is_noted(tmp_path, first):
    """A quantiser that reads a LayerNormalization (its last bit is the implementation's) is noted;
    one that reads only IEEE-rounded arithmetic and exact integer sums is not."""
    w1, w2 = RNG.normal(size=(32, 24)).astype(np.float32), RNG.normal(size=(24, 8)).astype(np.float32)
    head = (oh.make_node("LayerNormalization", ["x", "gamma", "beta"], ["h0"]) if first == "LayerNormalization"
            else oh.make_node("Add", ["x", "beta"], ["h0"]))
    model = _float_model([head, oh.make_node("MatMul", ["h0", "w1"], ["h1"]), oh.make_node("Add", ["h1", "b"], ["h2"]),
                          oh.make_node("MatMul", ["h2", "w2"], ["y"])],
                         [oh.make_tensor_value_info("x", F, [4, 32])], [oh.make_tensor_value_info("y", F, [4, 8])],
                         [onh.from_array(v, k) for k, v in {"w1": w1, "w2": w2, "b": RNG.normal(size=24).astype(np.float32),
                                                            "gamma": np.ones(32, np.float32),
                                                            "beta": RNG.normal(size=32).astype(np.float32)}.items()])
    optimised, _ = _optimised(tmp_path, _quantize(tmp_path, model))
    assert sum(n.op_type == "DynamicQuantizeLinear" for n in optimised.graph.node) == 2
    noted = any(RUNTIME_QUANT_NOTE in note for note in lower(optimised).notes)
    assert noted == (first == "LayerNormalization")
