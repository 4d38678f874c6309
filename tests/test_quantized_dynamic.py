"""The decompose_dynamic_quant passes (edgebuild.graph.quantized.dynamic, dynamic_lstm).

Graphs are written the way onnxruntime's quantize_dynamic writes them (the core's tests run
without onnxruntime): DynamicQuantizeLinear -> MatMulInteger/ConvInteger -> Cast -> Mul(scale
product) [-> Add], and the com.microsoft ops from onnxruntime's contrib-op documentation. The
rewritten graph must compute the same values (onnx's reference evaluator runs both; the
com.microsoft ops are checked against their documented arithmetic in numpy, LSTM against the
steps of onnxruntime's kernel) and keep the weights as DequantizeLinear of the int8/uint8
initializers.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnx_ir as ir
import pytest
from onnx.reference import ReferenceEvaluator

from edgebuild.graph.quantized.dynamic import PASS
from edgebuild.graph.quantized.dynamic_lstm import PASS as LSTM_PASS

F, U8, I8 = onnx.TensorProto.FLOAT, onnx.TensorProto.UINT8, onnx.TensorProto.INT8
OPSET = 21  # onnx's reference DequantizeLinear starts at 19; the pass keeps the model's opset
RNG = np.random.default_rng(0)


def _model(nodes, inputs, outputs, initializers, ms=False):
    opsets = [oh.make_opsetid("", OPSET)] + ([oh.make_opsetid("com.microsoft", 1)] if ms else [])
    graph = oh.make_graph(nodes, "case", inputs, outputs, initializers)
    return oh.make_model(graph, opset_imports=opsets, ir_version=10)


def _rewrite(model: onnx.ModelProto, graph_pass=PASS) -> tuple[onnx.ModelProto, int]:
    ir_model = ir.serde.deserialize_model(model)
    fired = graph_pass.apply(ir_model)
    return ir.serde.serialize_model(ir_model), fired


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ReferenceEvaluator(model).run(None, feeds)


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def _dequantize_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == "DequantizeLinear"]


def _weight_dequantize(model: onnx.ModelProto) -> onnx.NodeProto:
    inits = {i.name for i in model.graph.initializer}
    [node] = [n for n in _dequantize_nodes(model) if n.input[0] in inits]
    return node


def _init(model: onnx.ModelProto, name: str) -> np.ndarray:
    return next(onh.to_array(i) for i in model.graph.initializer if i.name == name)


def _attr(node: onnx.NodeProto, name: str):
    return next((oh.get_attribute_value(a) for a in node.attribute if a.name == name), None)


def _cosine(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _integer_chain(op: str, w_q: np.ndarray, w_scale: np.ndarray, w_zp: np.ndarray, x_shape, scales_first: bool,
                   bias: np.ndarray | None = None, conv_attrs=None) -> onnx.ModelProto:
    """quantize_dynamic's spelling of a quantised MatMul/Conv."""
    product = ["x_scale", "w_scale"] if scales_first else ["w_scale", "x_scale"]
    nodes = [
        oh.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "x_scale", "x_zp"]),
        oh.make_node("Mul", product, ["scales"]),
        oh.make_node(op, ["x_q", "w_q", "x_zp", "w_zp"], ["acc"], **(conv_attrs or {})),
        oh.make_node("Cast", ["acc"], ["acc_f"], to=F),
        oh.make_node("Mul", ["acc_f", "scales"], ["y" if bias is None else "scaled"]),
    ]
    inits = [onh.from_array(w_q, "w_q"), onh.from_array(w_scale, "w_scale"), onh.from_array(w_zp, "w_zp")]
    if bias is not None:
        nodes.append(oh.make_node("Add", ["scaled", "bias"], ["y"]))
        inits.append(onh.from_array(bias, "bias"))
    return _model(nodes, [oh.make_tensor_value_info("x", F, x_shape)], [oh.make_tensor_value_info("y", F, None)], inits)


# -- MatMulInteger / ConvInteger ----------------------------------------------------------------

@pytest.mark.parametrize("scales_first", [True, False], ids=["x_scale_first", "w_scale_first"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_matmul_integer_becomes_dequantized_matmul(dtype, per_channel, scales_first):
    low, high = (-127, 128) if dtype == np.int8 else (0, 256)
    w_q = RNG.integers(low, high, (16, 6)).astype(dtype)
    w_scale = (RNG.uniform(0.01, 0.05, 6) if per_channel else np.array(0.03)).astype(np.float32)
    w_zp = (RNG.integers(low // 8, high // 8, 6) if per_channel else np.array(high // 2 if dtype == np.uint8 else 0)).astype(dtype)
    model = _integer_chain("MatMulInteger", w_q, w_scale, w_zp, [2, 3, 16], scales_first, RNG.normal(size=6).astype(np.float32))
    rewritten, fired = _rewrite(model)
    assert fired == 1
    assert "MatMulInteger" not in _ops(rewritten) and "Cast" not in _ops(rewritten)
    assert _ops(rewritten).count("DynamicQuantizeLinear") == 1 and "MatMul" in _ops(rewritten)
    weight = _weight_dequantize(rewritten)
    np.testing.assert_array_equal(_init(rewritten, weight.input[0]), w_q)  # the int8/uint8 weight itself
    assert _attr(weight, "axis") == (1 if per_channel else None)
    x = RNG.normal(size=(2, 3, 16)).astype(np.float32)
    [expected], [got] = _run(model, {"x": x}), _run(rewritten, {"x": x})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_shared_activation_is_dequantized_once():
    """quantize_dynamic quantises a tensor read by Q, K and V once; one DequantizeLinear serves them all."""
    nodes = [oh.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "x_scale", "x_zp"])]
    inits, outputs = [], []
    for k in range(3):
        w_q = RNG.integers(-127, 128, (8, 4)).astype(np.int8)
        inits += [onh.from_array(w_q, f"w{k}"), onh.from_array(np.array(0.02 * (k + 1), np.float32), f"s{k}"),
                  onh.from_array(np.array(0, np.int8), f"z{k}")]
        nodes += [oh.make_node("Mul", ["x_scale", f"s{k}"], [f"p{k}"]),
                  oh.make_node("MatMulInteger", ["x_q", f"w{k}", "x_zp", f"z{k}"], [f"a{k}"]),
                  oh.make_node("Cast", [f"a{k}"], [f"c{k}"], to=F), oh.make_node("Mul", [f"c{k}", f"p{k}"], [f"y{k}"])]
        outputs.append(oh.make_tensor_value_info(f"y{k}", F, None))
    model = _model(nodes, [oh.make_tensor_value_info("x", F, [5, 8])], outputs, inits)
    rewritten, fired = _rewrite(model)
    assert fired == 3
    assert len(_dequantize_nodes(rewritten)) == 4  # the activation's, and one per weight
    x = RNG.normal(size=(5, 8)).astype(np.float32)
    for expected, got in zip(_run(model, {"x": x}), _run(rewritten, {"x": x})):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert [o.name for o in rewritten.graph.output] == ["y0", "y1", "y2"]


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_conv_integer_becomes_dequantized_conv(per_channel):
    w_q = RNG.integers(0, 256, (4, 3, 3, 3)).astype(np.uint8)
    # a per-channel scale product multiplies the [N, C, H, W] output: shaped [C, 1, 1]
    w_scale = (RNG.uniform(0.01, 0.05, (4, 1, 1)) if per_channel else np.array(0.02)).astype(np.float32)
    w_zp = np.array(128, np.uint8)
    attrs = {"pads": [1, 1, 1, 1], "strides": [2, 1]}
    model = _integer_chain("ConvInteger", w_q, w_scale, w_zp, [1, 3, 7, 7], True, conv_attrs=attrs)
    rewritten, fired = _rewrite(model)
    assert fired == 1 and "ConvInteger" not in _ops(rewritten)
    [conv] = [n for n in rewritten.graph.node if n.op_type == "Conv"]
    assert _attr(conv, "pads") == [1, 1, 1, 1] and _attr(conv, "strides") == [2, 1]
    assert _attr(_weight_dequantize(rewritten), "axis") is None  # the scale multiplies the sum
    x = RNG.normal(size=(1, 3, 7, 7)).astype(np.float32)
    [expected], [got] = _run(model, {"x": x}), _run(rewritten, {"x": x})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_integer_op_read_otherwise_is_left_alone():
    """An int32 result that is also a graph output (or not Cast to float) keeps its integer op."""
    model = _integer_chain("MatMulInteger", RNG.integers(-127, 128, (4, 2)).astype(np.int8), np.array(0.1, np.float32),
                           np.array(0, np.int8), [3, 4], True)
    model.graph.output.append(oh.make_tensor_value_info("acc", onnx.TensorProto.INT32, None))
    rewritten, fired = _rewrite(model)
    assert fired == 0 and "MatMulInteger" in _ops(rewritten)


def test_scale_of_any_shape_multiplies_the_sum():
    """A scale product varying along another axis than the weight's still multiplies the integer sum
    as the graph writes it."""
    model = _integer_chain("MatMulInteger", RNG.integers(-127, 128, (4, 2)).astype(np.int8),
                           np.array([[0.1], [0.2], [0.3]], np.float32), np.array(0, np.int8), [3, 4], True)
    rewritten, fired = _rewrite(model)
    assert fired == 1 and "MatMulInteger" not in _ops(rewritten)
    x = RNG.normal(size=(3, 4)).astype(np.float32)
    np.testing.assert_array_equal(_run(rewritten, {"x": x})[0], _run(model, {"x": x})[0])


# -- com.microsoft matmuls ----------------------------------------------------------------------

def _dynamic_quantize(x: np.ndarray) -> tuple[np.ndarray, np.float32, np.float32]:
    """onnxruntime's (and ai.onnx's) uint8 run-time quantisation: (q, scale, zero point)."""
    low, high = np.float32(min(x.min(), 0)), np.float32(max(x.max(), 0))
    scale = np.float32((high - low) / np.float32(255)) if high != low else np.float32(1)
    zero = np.float32(np.clip(np.round(-low / scale), 0, 255))
    return np.clip(np.round(x / scale) + zero, 0, 255).astype(np.float32), scale, zero


def test_dynamic_quantize_matmul():
    b = RNG.integers(-127, 128, (12, 5)).astype(np.int8)
    bias = RNG.normal(size=5).astype(np.float32)
    node = oh.make_node("DynamicQuantizeMatMul", ["a", "b", "bs", "bz", "bias"], ["y"], domain="com.microsoft")
    model = _model([node], [oh.make_tensor_value_info("a", F, [3, 12])], [oh.make_tensor_value_info("y", F, None)],
                   [onh.from_array(b, "b"), onh.from_array(np.array(0.04, np.float32), "bs"),
                    onh.from_array(np.array(2, np.int8), "bz"), onh.from_array(bias, "bias")], ms=True)
    rewritten, fired = _rewrite(model)
    assert fired == 1 and sorted(_ops(rewritten)) == ["Add", "DequantizeLinear", "DequantizeLinear",
                                                      "DynamicQuantizeLinear", "MatMul", "Mul", "Mul"]
    a = RNG.normal(size=(3, 12)).astype(np.float32)
    q, scale, zero = _dynamic_quantize(a)
    expected = ((q - zero) @ (b.astype(np.float32) - 2)) * (scale * np.float32(0.04)) + bias
    [got] = _run(rewritten, {"a": a})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_matmul_integer_to_float_per_column():
    b = RNG.integers(0, 256, (6, 4)).astype(np.uint8)
    b_scale = RNG.uniform(0.01, 0.05, 4).astype(np.float32)
    b_zero = RNG.integers(100, 150, 4).astype(np.uint8)
    node = oh.make_node("MatMulIntegerToFloat", ["a", "b", "as", "bs", "az", "bz"], ["y"], domain="com.microsoft")
    model = _model([node], [oh.make_tensor_value_info("a", U8, [2, 6]), oh.make_tensor_value_info("as", F, [])],
                   [oh.make_tensor_value_info("y", F, None)],
                   [onh.from_array(b, "b"), onh.from_array(b_scale, "bs"), onh.from_array(np.array(17, np.uint8), "az"),
                    onh.from_array(b_zero, "bz")], ms=True)
    rewritten, fired = _rewrite(model)
    assert fired == 1 and "MatMulIntegerToFloat" not in _ops(rewritten)
    assert _attr(_weight_dequantize(rewritten), "axis") == 1
    a = RNG.integers(0, 256, (2, 6)).astype(np.uint8)
    a_scale = np.array(0.1, np.float32)
    expected = ((a.astype(np.float32) - 17) * a_scale) @ ((b.astype(np.float32) - b_zero) * b_scale)
    [got] = _run(rewritten, {"a": a, "as": a_scale})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


# -- DynamicQuantizeLSTM ------------------------------------------------------------------------

def _lstm_case(direction: str, per_channel: bool, steps=5, batch=1, features=4, hidden=3):
    dirs = 2 if direction == "bidirectional" else 1
    w = RNG.integers(-127, 128, (dirs, features, 4 * hidden)).astype(np.int8)
    r = RNG.integers(-127, 128, (dirs, hidden, 4 * hidden)).astype(np.int8)
    shape = (dirs, 4 * hidden) if per_channel else (dirs,)
    w_scale = RNG.uniform(0.002, 0.01, shape).astype(np.float32)
    r_scale = RNG.uniform(0.002, 0.01, shape).astype(np.float32)
    zero = np.zeros(shape, np.int8)
    bias = RNG.normal(scale=0.3, size=(dirs, 8 * hidden)).astype(np.float32)
    node = oh.make_node("DynamicQuantizeLSTM", ["x", "w", "r", "b", "", "h0", "c0", "", "ws", "wz", "rs", "rz"],
                        ["y", "y_h", "y_c"], domain="com.microsoft", hidden_size=hidden, direction=direction)
    inits = [onh.from_array(w, "w"), onh.from_array(r, "r"), onh.from_array(bias, "b"), onh.from_array(w_scale, "ws"),
             onh.from_array(zero, "wz"), onh.from_array(r_scale, "rs"), onh.from_array(zero.copy(), "rz")]
    model = _model([node], [oh.make_tensor_value_info("x", F, [steps, batch, features]),
                            oh.make_tensor_value_info("h0", F, [dirs, batch, hidden]),
                            oh.make_tensor_value_info("c0", F, [dirs, batch, hidden])],
                   [oh.make_tensor_value_info(n, F, None) for n in ("y", "y_h", "y_c")], inits, ms=True)
    feeds = {"x": RNG.normal(size=(steps, batch, features)).astype(np.float32),
             "h0": RNG.uniform(-0.5, 0.5, (dirs, batch, hidden)).astype(np.float32),
             "c0": RNG.uniform(-0.5, 0.5, (dirs, batch, hidden)).astype(np.float32)}
    return model, feeds, (w, r, w_scale, r_scale, bias)


def _lstm_like_onnxruntime(feeds, weights, direction, hidden):
    """The kernel's steps: X quantised once, each step's hidden state quantised, float gates (i, o, f, c)."""
    w, r, w_scale, r_scale, bias = weights
    sigmoid = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    x = feeds["x"]
    ys, hs, cs = [], [], []
    for d, reverse in enumerate([direction == "reverse"] if direction != "bidirectional" else [False, True]):
        q, s, z = _dynamic_quantize(x)
        w_d = w[d].astype(np.float32) * (w_scale[d] if w_scale.ndim == 2 else w_scale[d])
        r_d = r[d].astype(np.float32) * (r_scale[d] if r_scale.ndim == 2 else r_scale[d])
        projected = ((q - z) * s) @ w_d + bias[d, : 4 * hidden] + bias[d, 4 * hidden:]
        h, c = feeds["h0"][d], feeds["c0"][d]
        out = [None] * x.shape[0]
        for t in (range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])):
            hq, hs_, hz = _dynamic_quantize(h)
            g = projected[t] + ((hq - hz) * hs_) @ r_d
            i, o, f, cc = (g[:, k * hidden:(k + 1) * hidden] for k in range(4))
            c = sigmoid(f) * c + sigmoid(i) * np.tanh(cc)
            h = sigmoid(o) * np.tanh(c)
            out[t] = h
        ys.append(np.stack(out)[:, None])
        hs.append(h[None])
        cs.append(c[None])
    return np.concatenate(ys, 1), np.concatenate(hs), np.concatenate(cs)


@pytest.mark.parametrize("direction,per_channel", [("forward", False), ("reverse", True), ("bidirectional", True)])
def test_dynamic_quantize_lstm_unrolls_like_onnxruntime(direction, per_channel):
    model, feeds, weights = _lstm_case(direction, per_channel)
    rewritten, fired = _rewrite(model)
    assert fired == 1 and "DynamicQuantizeLSTM" not in _ops(rewritten)
    steps, dirs = feeds["x"].shape[0], 2 if direction == "bidirectional" else 1
    # X quantised once, the hidden state once per step and direction
    assert _ops(rewritten).count("DynamicQuantizeLinear") == 1 + steps * dirs
    weight_inputs = {n.input[0] for n in _weight_dequantize_all(rewritten)}
    assert all(_init(rewritten, name).dtype == np.int8 for name in weight_inputs) and len(weight_inputs) == 2 * dirs
    expected = _lstm_like_onnxruntime(feeds, weights, direction, 3)
    got = _run(rewritten, feeds)
    for e, g in zip(expected, got):
        assert g.shape == e.shape
        assert _cosine(g, e) >= 0.9999
        np.testing.assert_allclose(g, e, atol=5e-3)  # a flipped rounding moves a gate by ~a step


def _weight_dequantize_all(model):
    inits = {i.name for i in model.graph.initializer}
    return [n for n in _dequantize_nodes(model) if n.input[0] in inits]


def test_lstm_with_unknown_sequence_length_waits_for_the_later_pass():
    """X's shape unknown before folding: the first pass leaves the LSTM, the later one infers and unrolls it."""
    model, feeds, weights = _lstm_case("forward", False)
    node = model.graph.node[0]
    node.input[0] = "x_copy"
    model.graph.node.insert(0, oh.make_node("Identity", ["x"], ["x_copy"]))
    rewritten, fired = _rewrite(model)
    assert fired == 0 and "DynamicQuantizeLSTM" in _ops(rewritten)
    rewritten, fired = _rewrite(rewritten, LSTM_PASS)
    assert fired == 1 and "DynamicQuantizeLSTM" not in _ops(rewritten)
    expected = _lstm_like_onnxruntime(feeds, weights, "forward", 3)
    for e, g in zip(expected, _run(rewritten, feeds)):
        assert _cosine(g, e) >= 0.9999


def test_lstm_with_run_time_weights_is_left_marked():
    """A form the unrolling cannot take stays, with the reason the backend's error will name
    (every other form: tests/test_quantized_lstm_forms.py, against onnxruntime)."""
    model, _, _ = _lstm_case("forward", False)
    model.graph.initializer.remove(next(i for i in model.graph.initializer if i.name == "r"))
    model.graph.input.append(oh.make_tensor_value_info("r", I8, [1, 3, 12]))
    rewritten, fired = _rewrite(model)
    assert fired == 0 and "DynamicQuantizeLSTM" in _ops(rewritten)
    rewritten, fired = _rewrite(rewritten, LSTM_PASS)
    [node] = rewritten.graph.node
    assert fired == 0 and node.op_type == "DynamicQuantizeLSTM"
    reason = {p.key: p.value for p in node.metadata_props}["edgebuild.declined"]
    assert "input R is computed at run time" in reason


# -- registration -------------------------------------------------------------------------------

def test_the_passes_are_registered_first_and_resolve():
    from edgebuild.graph.fusion import graph_pass
    from edgebuild.registry import build_registry

    table = build_registry().tables["passes"]
    names = list(table)
    # the quantised-form decompositions come before every other pass (dequantize_weights included)
    assert names.index("decompose_dynamic_quant") < names.index("dequantize_weights")
    assert names.index("decompose_dynamic_quant_lstm") < names.index("fuse_conv_bn")
    for name, implementation in (("decompose_dynamic_quant", PASS), ("decompose_dynamic_quant_lstm", LSTM_PASS)):
        registered = table[name].obj
        assert graph_pass(name) is implementation and implementation.name == name and implementation.description
        assert (registered.default, registered.before_folding) == (implementation.default, implementation.before_folding)
