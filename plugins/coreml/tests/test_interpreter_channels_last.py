"""Channels-last activations in the interpreter's torch kernels (worker processes): a depthwise
conv's torch result stays channels last, and the ops reading it (a 1x1 conv, a global pool, an
fp16 cast, fp16 arithmetic, the in-place hand-over of a value nobody else holds) give what the
C-ordered path gives, on ppocr_cls's shapes."""

from __future__ import annotations

import numpy as np
import pytest
from edgebuild_coreml.interpreter import torch_kernels
from edgebuild_coreml.interpreter.compiled import _owns_writable_memory
from edgebuild_coreml.interpreter.ops_conv import conv
from edgebuild_coreml.interpreter.ops_elementwise import binary_in_place
from edgebuild_coreml.interpreter.ops_reduce import reduce

pytest.importorskip("torch")

RNG = np.random.default_rng(23)


class _Op:
    """A stand-in for a MIL op: the evaluators read its type and name, and keep caches on it."""

    def __init__(self, op_type):
        self.op_type, self.name = op_type, op_type


@pytest.fixture
def torch_on():
    torch_kernels.enable(threads=1)
    yield
    torch_kernels.disable()


def _channels_last(array):
    return np.ascontiguousarray(array.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


def _conv_args(x, weight, strides, pad, groups):
    return {"x": x, "weight": weight, "bias": RNG.standard_normal(weight.shape[0]).astype(np.float32),
            "strides": np.array(strides), "dilations": np.array([1, 1]), "groups": np.int32(groups),
            "pad_type": "custom", "pad": np.array(pad)}


# ppocr_cls's depthwise convs: (input, kernel, strides, pad)
DEPTHWISE = [((1, 88, 3, 96), 5, [1, 1], [2, 2, 2, 2]), ((1, 32, 6, 96), 5, [2, 1], [2, 2, 2, 2]),
             ((1, 24, 12, 96), 3, [2, 1], [1, 1, 1, 1]), ((1, 8, 24, 96), 3, [2, 1], [1, 0, 0, 1])]


@pytest.mark.parametrize("shape, k, strides, pad", DEPTHWISE)
@pytest.mark.parametrize("layout", ["c_order", "channels_last"])
def test_depthwise_torch_conv_is_channels_last_and_matches_numpy(torch_on, shape, k, strides, pad, layout):
    x = RNG.standard_normal(shape).astype(np.float32)
    weight = (RNG.standard_normal((shape[1], 1, k, k)) / k).astype(np.float32)
    args = _conv_args(_channels_last(x) if layout == "channels_last" else x, weight, strides, pad, shape[1])
    got = conv(_Op("conv"), args)
    assert torch_kernels.channels_last(got)
    torch_kernels.disable()
    expected = conv(_Op("conv"), {**args, "x": x})
    assert expected.flags.c_contiguous
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape, c_out", [((1, 88, 3, 96), 16), ((1, 200, 2, 96), 32), ((2, 8, 12, 96), 24)])
def test_pointwise_conv_of_a_channels_last_input_matches_the_c_order_path(torch_on, shape, c_out):
    x = RNG.standard_normal(shape).astype(np.float32)
    weight = (RNG.standard_normal((c_out, shape[1], 1, 1)) / np.sqrt(shape[1])).astype(np.float32)
    op = _Op("conv")  # one op handed both layouts: the call made for its shape serves both
    args = _conv_args(x, weight, [1, 1], [0, 0, 0, 0], 1)
    expected = conv(op, args)
    got = conv(op, {**args, "x": _channels_last(x)})
    assert torch_kernels.channels_last(got) and expected.flags.c_contiguous
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 200, 2, 96), (2, 40, 3, 96)])
@pytest.mark.parametrize("keep_dims", [True, False])
@pytest.mark.parametrize("op_type", ["reduce_mean", "reduce_sum"])
def test_global_pool_of_a_channels_last_input_matches(shape, keep_dims, op_type):
    x = RNG.standard_normal(shape).astype(np.float32)
    args = {"axes": np.array([2, 3]), "keep_dims": np.bool_(keep_dims)}
    op = _Op(op_type)
    for _ in range(2):  # the second from the layout kept on the op
        got = reduce(op, {**args, "x": _channels_last(x)})
        expected = reduce(_Op(op_type), {**args, "x": x})
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)  # summation order
    other = reduce(op, {"axes": np.array([1]), "keep_dims": np.bool_(True), "x": _channels_last(x)})  # not spatial
    np.testing.assert_allclose(other, reduce(_Op(op_type), {"axes": np.array([1]), "keep_dims": np.bool_(True), "x": x}),
                               rtol=1e-5, atol=1e-4)  # summation order: a sum of 200 values near zero


def test_an_fp16_cast_keeps_the_channels_last_layout(torch_on):
    x = _channels_last(RNG.standard_normal((1, 88, 3, 96)).astype(np.float32))
    half = torch_kernels.cast(x, np.float16)
    assert torch_kernels.channels_last(half)
    np.testing.assert_array_equal(half, x.astype(np.float16))
    np.testing.assert_array_equal(torch_kernels.cast(half, np.float32), x.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("op_type", ["add", "sub", "mul", "real_div", "maximum", "minimum"])
def test_fp16_arithmetic_through_torch_is_the_widened_numpy_result_bit_for_bit(torch_on, op_type):
    shape = (1, 88, 3, 96)
    scale = RNG.choice([1e-3, 1.0, 300.0], size=shape)
    a = (RNG.standard_normal(shape) * scale).astype(np.float16)
    gate = (RNG.standard_normal((1, 88, 1, 1)) * 3).astype(np.float16)
    for x, y in ((a, gate), (_channels_last(a), gate), (_channels_last(a), _channels_last(a[:, :, ::-1]))):
        got = binary_in_place(_Op(op_type), {"x": x, "y": y})
        assert got.dtype == np.float16
        with np.errstate(all="ignore"):
            torch_kernels.disable()
            expected = binary_in_place(_Op(op_type), {"x": x, "y": y}).astype(np.float16)
            torch_kernels.enable(threads=1)
        np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))


def test_a_channels_last_view_of_an_array_nobody_else_holds_may_be_overwritten():
    def fresh_view():
        return np.ones((1, 3, 4, 8), np.float32).transpose(0, 3, 1, 2)

    assert _owns_writable_memory(fresh_view())
    held = np.ones((1, 3, 4, 8), np.float32)
    assert not _owns_writable_memory(held.transpose(0, 3, 1, 2))  # ``held`` still reads it
    assert not _owns_writable_memory(np.ones((2, 8), np.float32)[:1])  # a part of an array
    assert not _owns_writable_memory(np.ones((4, 8), np.float32).T)  # a transpose keeps its own layout
