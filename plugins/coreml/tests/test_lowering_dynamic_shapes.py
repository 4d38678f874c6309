"""Lowerings of graphs whose input keeps a flexible (symbolic) dimension: the shape arithmetic
that depends on it (Shape/Gather/Concat/Reshape, Slice, Range, Expand, Tile, ConstantOfShape, Pad
with runtime pads) stays as MIL ops. Each model is lowered once and run in the MIL interpreter
at several sizes of the flexible dim, against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx_cases import IR_VERSION, assert_matches, lower, run_onnxruntime

from edgebuild_coreml.interpreter import run_program
from edgebuild_coreml.lowering.errors import LoweringError

F, I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
SIZES = (1, 4, 9, 17)  # the flexible dim at these sizes


def _vector(name, *values):
    return oh.make_tensor(name, I64, [len(values)], list(values))


def _scalar(name, value):
    return oh.make_tensor(name, I64, [], [value])


def _model(nodes, inputs, inits=(), opset=18):
    graph = oh.make_graph(nodes, "dynamic", inputs, [onnx.ValueInfoProto(name="y")], list(inits))
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], ir_version=IR_VERSION)


def _x(*dims):
    return oh.make_tensor_value_info("x", F, list(dims))


def _check_at_sizes(model, shape_of_size, sizes=SIZES, extra=None):
    """Lower once with the symbolic input; at each size run it and onnxruntime and compare."""
    result = lower(model)
    mil_input = result.input_names["x"]
    assert any(not isinstance(d, int) for d in result.program.functions["main"].inputs[mil_input].shape)
    for size in sizes:
        x = np.random.default_rng(size).standard_normal(shape_of_size(size)).astype(np.float32)
        feeds = {"x": x, **(extra or {})}
        expected = run_onnxruntime(model, feeds)["y"]
        produced = run_program(result.program, {result.input_names[k]: v for k, v in feeds.items()})
        assert_matches(produced[result.output_names["y"]], expected, rtol=1e-5, atol=1e-5, name=f"size {size}")
    return result


def _op_types(result) -> set[str]:
    return {op.op_type for op in result.program.functions["main"].operations}


def test_shape_gather_concat_reshape_chain():
    """x [2, T, 3] -> reshape to [-1, T] with T read from Shape."""
    model = _model([
        oh.make_node("Shape", ["x"], ["s"]), oh.make_node("Gather", ["s", "i1"], ["t"], axis=0),
        oh.make_node("Unsqueeze", ["t", "axis0"], ["tu"]), oh.make_node("Concat", ["minus1", "tu"], ["target"], axis=0),
        oh.make_node("Reshape", ["x", "target"], ["y"])],
        [_x(2, "T", 3)], [_scalar("i1", 1), _vector("axis0", 0), _vector("minus1", -1)])
    result = _check_at_sizes(model, lambda t: (2, t, 3))
    assert {"shape", "gather", "concat", "reshape"} <= _op_types(result)


def test_slice_with_runtime_end():
    """x[:, 1:T-1]: the end comes from the shape."""
    model = _model([
        oh.make_node("Shape", ["x"], ["s"]), oh.make_node("Gather", ["s", "i1"], ["t"], axis=0),
        oh.make_node("Sub", ["t", "one"], ["e0"]), oh.make_node("Unsqueeze", ["e0", "axis0"], ["end"]),
        oh.make_node("Slice", ["x", "start", "end", "axes"], ["y"])],
        [_x(2, "T", 3)], [_scalar("i1", 1), _scalar("one", 1), _vector("axis0", 0), _vector("start", 1), _vector("axes", 1)])
    _check_at_sizes(model, lambda t: (2, t, 3), sizes=(3, 4, 9, 17))


def test_range_constant_of_shape_and_expand():
    """Positions 0..T-1 (Range), a ConstantOfShape of x's shape and an Expand to it."""
    model = _model([
        oh.make_node("Shape", ["x"], ["s"]), oh.make_node("Gather", ["s", "i2"], ["t"], axis=0),
        oh.make_node("Range", ["zero", "t", "one"], ["r"]), oh.make_node("Cast", ["r"], ["rf"], to=F),
        oh.make_node("ConstantOfShape", ["s"], ["half"], value=oh.make_tensor("v", F, [1], [0.5])),
        oh.make_node("Add", ["half", "rf"], ["hr"]),
        oh.make_node("Expand", ["bias", "s"], ["bx"]), oh.make_node("Add", ["hr", "bx"], ["y"])],
        [_x(2, 3, "T"), oh.make_tensor_value_info("bias", F, [1, 3, 1])],
        [_scalar("i2", 2), _scalar("zero", 0), _scalar("one", 1)])
    bias = np.arange(3, dtype=np.float32).reshape(1, 3, 1)
    result = _check_at_sizes(model, lambda t: (2, 3, t), extra={"bias": bias})
    assert {"range_1d", "fill", "tile"} & _op_types(result)


def test_tile_with_runtime_repeats():
    """An [1, 2, 3] block tiled T times along the first axis."""
    model = _model([
        oh.make_node("Shape", ["x"], ["s"]), oh.make_node("Slice", ["s", "zero", "one"], ["t"]),
        oh.make_node("Concat", ["t", "one", "one"], ["reps"], axis=0), oh.make_node("Tile", ["block", "reps"], ["tiled"]),
        oh.make_node("ReduceSum", ["tiled", "axes12"], ["summed"], keepdims=0),
        oh.make_node("Unsqueeze", ["summed", "one"], ["col"]), oh.make_node("Add", ["x", "col"], ["y"])],
        [_x("T", 3), oh.make_tensor_value_info("block", F, [1, 2, 3])], [_vector("zero", 0), _vector("one", 1), _vector("axes12", 1, 2)])
    block = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    _check_at_sizes(model, lambda t: (t, 3), extra={"block": block})


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_with_runtime_pads(mode):
    """Pads computed from the flexible size: T // 4 on both ends of the last axis."""
    model = _model([
        oh.make_node("Shape", ["x"], ["s"]), oh.make_node("Slice", ["s", "two", "three"], ["t"]),
        oh.make_node("Div", ["t", "four"], ["q"]), oh.make_node("Concat", ["zeros2", "q", "zeros2", "q"], ["pads"], axis=0),
        oh.make_node("Pad", ["x", "pads"], ["y"], mode=mode)],
        [_x(1, 2, "T")], [_vector("two", 2), _vector("three", 3), _vector("four", 4), _vector("zeros2", 0, 0)])
    result = _check_at_sizes(model, lambda t: (1, 2, t), sizes=(2, 4, 9, 17))
    assert ("pad" in _op_types(result)) == (mode == "constant")


def test_pad_with_runtime_negative_pads_crops():
    """ONNX pads may be negative (a crop); a runtime pad vector may hold either sign."""
    model = _model([
        oh.make_node("Shape", ["x"], ["s"]), oh.make_node("Slice", ["s", "two", "three"], ["t"]),
        oh.make_node("Div", ["t", "four"], ["q"]), oh.make_node("Neg", ["q"], ["minus_q"]),
        oh.make_node("Concat", ["zeros2", "minus_q", "zeros2", "q"], ["pads"], axis=0),
        oh.make_node("Pad", ["x", "pads", "fill"], ["y"], mode="constant")],
        [_x(1, 2, "T")], [_vector("two", 2), _vector("three", 3), _vector("four", 4), _vector("zeros2", 0, 0),
                          oh.make_tensor("fill", F, [], [-2.0])])
    _check_at_sizes(model, lambda t: (1, 2, t), sizes=(2, 4, 9, 17))


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_constant_pads_on_a_flexible_axis(mode):
    """Constant pads on the flexible axis itself: reflect stays MIL's pad, the rest gather at run time."""
    model = _model([oh.make_node("Pad", ["x", "pads"], ["y"], mode=mode)], [_x(1, 2, "T")],
                   [_vector("pads", 0, 0, 3, 0, 0, 2)])
    result = _check_at_sizes(model, lambda t: (1, 2, t), sizes=(4, 9, 17))
    assert ("pad" in _op_types(result)) == (mode in ("constant", "reflect"))


def test_negative_constant_pads_on_a_flexible_axis():
    model = _model([oh.make_node("Pad", ["x", "pads"], ["y"], mode="constant")], [_x(2, "T")],
                   [_vector("pads", 1, -2, 0, 3)])
    _check_at_sizes(model, lambda t: (2, t), sizes=(3, 9, 17))


def test_reflect_pad_of_a_conv_front_end():
    """An STFT-like front end (silero's shape): frames [T, 576] reflect-padded on the static axis,
    then a strided conv over every frame; T stays flexible."""
    rng = np.random.default_rng(0)
    basis = oh.make_tensor("basis", F, [8, 1, 64], rng.standard_normal((8, 1, 64)).astype(np.float32).ravel().tolist())
    model = _model([
        oh.make_node("Pad", ["x", "pads"], ["padded"], mode="reflect"),
        oh.make_node("Unsqueeze", ["padded", "one"], ["frames"]),
        oh.make_node("Conv", ["frames", "basis"], ["y"], kernel_shape=[64], strides=[32])],
        [_x("T", 576)], [_vector("pads", 0, 32, 0, 32), _vector("one", 1), basis])
    _check_at_sizes(model, lambda t: (t, 576), sizes=(1, 3, 16))


def test_max_pool_over_a_flexible_width():
    model = _model([oh.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])], [_x(1, 3, 8, "W")])
    _check_at_sizes(model, lambda w: (1, 3, 8, w), sizes=(2, 7, 16))


def test_ceil_mode_pool_over_a_flexible_width_is_refused():
    model = _model([oh.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)],
                   [_x(1, 3, 8, "W")])
    with pytest.raises(LoweringError, match=r"MaxPool.*ceil_mode pooling places its windows by the input size"):
        lower(model)


def test_lstm_over_a_flexible_sequence():
    """The fused LSTM runs any number of steps; the sequence length stays flexible."""
    rng = np.random.default_rng(1)
    hidden, width = 4, 3

    def tensor(name, shape):
        return oh.make_tensor(name, F, list(shape), (0.5 * rng.standard_normal(shape)).astype(np.float32).ravel().tolist())

    model = _model([oh.make_node("LSTM", ["x", "w", "r", "b"], ["y"], hidden_size=hidden)], [_x("T", 1, width)],
                   [tensor("w", (1, 4 * hidden, width)), tensor("r", (1, 4 * hidden, hidden)), tensor("b", (1, 8 * hidden))])
    _check_at_sizes(model, lambda t: (t, 1, width), sizes=(1, 5, 12))


def test_unrolled_lstm_over_a_flexible_sequence_is_refused():
    rng = np.random.default_rng(2)

    def tensor(name, shape):
        return oh.make_tensor(name, F, list(shape), rng.standard_normal(shape).astype(np.float32).ravel().tolist())

    model = _model([oh.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=2, clip=1.0)], [_x("T", 1, 3)],
                   [tensor("w", (1, 8, 3)), tensor("r", (1, 8, 2))])
    with pytest.raises(LoweringError, match=r"LSTM.*unrolled, which needs a static sequence length"):
        lower(model)
