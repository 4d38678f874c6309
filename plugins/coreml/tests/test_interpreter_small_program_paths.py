"""The interpreter's paths for small programs (silero_vad's conv front end and LSTM, run in the
build's own process) give what the general paths give, and what onnxruntime gives: a small
map's conv as one matrix of every sample's pixels, returned channels last; the default-activation
LSTM with its sigmoid gates through one tanh."""

from __future__ import annotations

import numpy as np
import pytest
from edgebuild_coreml.interpreter import ops_conv, ops_rnn
from edgebuild_coreml.interpreter.ops_conv import conv

RNG = np.random.default_rng(17)


class _Op:
    """A stand-in for a MIL op: the evaluators read its type and name, and keep caches on it."""

    def __init__(self, op_type):
        self.op_type, self.name = op_type, op_type


# silero_vad 16k's convs (input, weight, strides, (before, after) pads), and a 2-D one of a few
# pixels with uneven padding and dilation
SMALL_MAP_CONVS = [
    ((16, 1, 832), (258, 1, 256), [128], [(0, 0)], [1]),  # its STFT as a strided 256-tap conv
    ((16, 129, 4), (128, 129, 3), [1], [(1, 1)], [1]),
    ((16, 128, 4), (64, 128, 3), [2], [(1, 1)], [1]),
    ((16, 64, 1), (128, 64, 3), [1], [(1, 1)], [1]),
    ((2, 3, 9, 7), (5, 3, 3, 2), [2, 1], [(1, 0), (0, 1)], [1, 2]),
]


def _conv_args(x_shape, w_shape, strides, pads, dilations, bias=True):
    x = RNG.standard_normal(x_shape).astype(np.float32)
    weight = (RNG.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
    args = {"x": x, "weight": weight, "strides": np.array(strides), "dilations": np.array(dilations),
            "groups": np.int32(1), "pad_type": "custom", "pad": np.array([p for pair in pads for p in pair])}
    if bias:
        args["bias"] = RNG.standard_normal(w_shape[0]).astype(np.float32)
    return args


@pytest.mark.parametrize("x_shape, w_shape, strides, pads, dilations", SMALL_MAP_CONVS)
@pytest.mark.parametrize("bias", [True, False])
def test_a_small_map_conv_matches_the_per_sample_windows_path(x_shape, w_shape, strides, pads, dilations, bias):
    args = _conv_args(x_shape, w_shape, strides, pads, dilations, bias)
    got = conv(_Op("conv"), args)
    nd = len(x_shape) - 2
    out_sizes = ops_conv.output_sizes(x_shape[2:], ops_conv.effective_kernel(w_shape[2:], dilations), strides, pads)
    expected = np.empty((x_shape[0], w_shape[0], *out_sizes), np.float32)
    ops_conv._im2col_windows(args["x"], args["weight"], strides, dilations, pads, 1, expected)
    if bias:
        expected += args["bias"].reshape(-1, *[1] * nd)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert not got.flags.c_contiguous or int(np.prod(out_sizes)) == 1  # channels last
    # an op reading it (another conv, a reshape) sees the same values as from a C-ordered copy
    pointwise = _conv_args(got.shape, (3, w_shape[0], *[1] * nd), [1] * nd, [(0, 0)] * nd, [1] * nd)
    np.testing.assert_allclose(conv(_Op("conv"), {**pointwise, "x": got}),
                               conv(_Op("conv"), {**pointwise, "x": np.ascontiguousarray(got)}), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got.reshape(-1), np.ascontiguousarray(got).reshape(-1))


def test_silero_stft_conv_matches_onnxruntime():
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    x_shape, w_shape, strides, pads, dilations = SMALL_MAP_CONVS[0]
    args = _conv_args(x_shape, w_shape, strides, pads, dilations, bias=False)
    node = helper.make_node("Conv", ["x", "w"], ["y"], strides=strides, pads=[0, 0])
    graph = helper.make_graph([node], "stft", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (16, 258, 5))],
                              [numpy_helper.from_array(args["weight"], "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    [expected] = session.run(None, {"x": args["x"]})
    onnx.checker.check_model(model)
    np.testing.assert_allclose(conv(_Op("conv"), args), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("clip", [None, 0.3])
@pytest.mark.parametrize("batch", [1, 3])
def test_default_lstm_matches_the_general_pass(clip, batch):
    hidden, steps, width = 128, 16, 128  # silero_vad's LSTM
    seq = RNG.standard_normal((steps, batch, width)).astype(np.float32)
    w_ih = (RNG.standard_normal((4 * hidden, width)) * 0.2).astype(np.float32)
    w_hh = (RNG.standard_normal((4 * hidden, hidden)) * 0.2).astype(np.float32)
    bias = RNG.standard_normal(4 * hidden).astype(np.float32)
    h = (RNG.standard_normal((batch, hidden)) * 0.1).astype(np.float32)
    c = (RNG.standard_normal((batch, hidden)) * 0.1).astype(np.float32)
    general = ops_rnn._lstm_pass(seq, h, c, w_ih, w_hh, bias, None, clip, ops_rnn._DEFAULT_ACTS)
    default = ops_rnn._lstm_pass_default(seq, h.copy(), c.copy(), ops_rnn._halved_sigmoid_gates(w_ih, w_hh, bias), clip)
    for got, expected in zip(default, general):
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-5, atol=1e-6)


def test_lstm_evaluator_keeps_its_halved_weights_per_op_and_matches_the_general_pass():
    hidden, width = 8, 5
    x = {"x": RNG.standard_normal((6, 2, width)).astype(np.float32),
         "initial_h": RNG.standard_normal((2, hidden)).astype(np.float32),
         "initial_c": RNG.standard_normal((2, hidden)).astype(np.float32),
         "weight_ih": RNG.standard_normal((4 * hidden, width)).astype(np.float32),
         "weight_hh": RNG.standard_normal((4 * hidden, hidden)).astype(np.float32),
         "bias": RNG.standard_normal(4 * hidden).astype(np.float32), "output_sequence": np.bool_(True)}
    op = _Op("lstm")
    first = ops_rnn.lstm(op, x)
    second = ops_rnn.lstm(op, x)  # from the halved weights kept on the op
    general = ops_rnn._lstm_pass(x["x"], x["initial_h"], x["initial_c"], x["weight_ih"], x["weight_hh"], x["bias"],
                                 None, None, ops_rnn._DEFAULT_ACTS)
    for got in (first, second):
        np.testing.assert_allclose(got[0], np.stack(general[0]), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[1], general[1], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[2], general[2], rtol=1e-5, atol=1e-6)
    other = {**x, "weight_hh": x["weight_hh"] * 0.5}  # another weight: worked out again
    np.testing.assert_allclose(ops_rnn.lstm(op, other)[1], ops_rnn._lstm_pass(
        x["x"], x["initial_h"], x["initial_c"], x["weight_ih"], other["weight_hh"], x["bias"], None, None,
        ops_rnn._DEFAULT_ACTS)[1], rtol=1e-5, atol=1e-6)
