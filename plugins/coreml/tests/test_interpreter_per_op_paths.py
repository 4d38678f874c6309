"""The interpreter's per-op fast paths give what the general ones give: max pooling tap by tap
against the strided-window maximum, and evaluators whose parsed parameters, broadcast checks and
reduction layouts are kept on the op (``_params.per_op``) against a fresh op each call, also
when the op is handed other shapes or other constants."""

from __future__ import annotations

import numpy as np
import pytest
from edgebuild_coreml.interpreter import ops_pool
from edgebuild_coreml.interpreter.ops_pool import max_pool

RNG = np.random.default_rng(11)


class _Op:
    """A stand-in for a MIL op: the evaluators read its type and name, and keep caches on it."""

    def __init__(self, op_type):
        self.op_type, self.name = op_type, op_type


def _pool_args(shape, kernel, strides, pad, ceil_mode, pad_type="custom"):
    x = RNG.standard_normal(shape).astype(np.float32)
    x.reshape(-1)[::37] = np.nan  # NaN propagates through both
    return {"x": x, "kernel_sizes": np.array(kernel), "strides": np.array(strides), "pad_type": pad_type,
            "pad": np.array(pad), "ceil_mode": np.bool_(ceil_mode)}


@pytest.mark.parametrize("shape, kernel, strides, pad, ceil_mode", [
    ((1, 200, 2, 96), [2, 2], [2, 2], [0, 0, 0, 0], False),  # ppocr_cls's pool
    ((1, 8, 24, 96), [3, 3], [2, 2], [1, 1, 1, 1], False),
    ((2, 3, 11, 10), [2, 3], [2, 1], [0, 1, 1, 0], True),  # ceil mode: windows past the padding
    ((2, 3, 11, 10), [3, 3], [2, 2], [0, 0, 0, 0], True),  # ceil mode without padding
    ((1, 4, 17), [3], [2], [1, 1], False),  # 1-D
    ((1, 2, 5, 6, 7), [2, 3, 2], [2, 2, 3], [0, 1, 1, 0, 0, 1], False),  # 3-D
])
def test_max_pool_dim_by_dim_matches_the_window_maximum(shape, kernel, strides, pad, ceil_mode):
    x = _pool_args(shape, kernel, strides, pad, ceil_mode)
    by_taps = max_pool(_Op("max_pool"), x)
    kernel_, strides_, pads, out_sizes = ops_pool._geometry(_Op("max_pool"), x, x["x"])
    by_windows = ops_pool._pooled(x["x"], kernel_, strides_, pads, out_sizes, -np.inf).max(
        axis=ops_pool._kernel_axes(len(kernel_)))
    assert by_taps.shape == by_windows.shape and by_taps.dtype == by_windows.dtype
    np.testing.assert_array_equal(by_taps, by_windows)
    assert not np.shares_memory(by_taps, x["x"])  # a fresh array: later ops may write into it


def test_a_large_pool_kernel_takes_the_window_maximum():
    x = _pool_args((1, 3, 9, 9), [9, 9], [1, 1], [0, 0, 0, 0], False)
    np.testing.assert_array_equal(max_pool(_Op("max_pool"), x), np.max(x["x"], axis=(2, 3), keepdims=True))


def test_an_op_handed_other_shapes_or_constants_is_worked_out_again():
    from edgebuild_coreml.interpreter.ops_activation import sigmoid_hard
    from edgebuild_coreml.interpreter.ops_elementwise import binary_in_place
    from edgebuild_coreml.interpreter.ops_reduce import reduce

    def fresh(evaluate, op_type, x):
        return evaluate(_Op(op_type), {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in x.items()})

    mean, hard, mul = _Op("reduce_mean"), _Op("sigmoid_hard"), _Op("mul")
    for shape in [(1, 8, 3, 5), (2, 8, 3, 5), (1, 8, 4, 5), (1, 8, 4, 5)]:  # a shape again: the kept layout
        x = RNG.standard_normal(shape).astype(np.float32)
        for axes in (np.array([2, 3], np.int32), np.array([1], np.int32)):
            args = {"x": x, "axes": axes, "keep_dims": np.bool_(True)}
            np.testing.assert_allclose(reduce(mean, args), fresh(reduce, "reduce_mean", args), rtol=1e-6)
            np.testing.assert_allclose(reduce(mean, args), np.mean(x, axis=tuple(axes), keepdims=True), rtol=1e-5,
                                       atol=1e-6)
        for alpha, beta in ((np.float32(0.2), np.float32(0.5)), (np.float32(1 / 6), np.float32(0.5))):
            args = {"x": x, "alpha": alpha, "beta": beta}
            np.testing.assert_array_equal(sigmoid_hard(hard, args), np.clip(x * alpha + beta, 0, 1))
        for y in (RNG.standard_normal(shape).astype(np.float32), RNG.standard_normal((1, 8, 1, 1)).astype(np.float32),
                  np.float32(3)):
            args = {"x": x.copy(), "y": y}
            donated = binary_in_place(mul, args, donated=("x",))
            assert donated is args["x"]  # written into the donated operand, its shape and type the result's
            np.testing.assert_array_equal(donated, x * y)
        widened = {"x": x, "y": np.float16(2)}  # fp16 and fp32 mixed: not written into the undonated operand
        np.testing.assert_array_equal(binary_in_place(mul, widened, donated=()), x * np.float32(2))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("layout", ["c_order", "channels_last"])
def test_a_1x1_conv_of_one_pixel_matches_the_matrix_product(bias, layout):
    """A squeeze-and-excite's 1x1 conv of a global pool: one matrix-vector product."""
    from edgebuild_coreml.interpreter.ops_conv import conv

    x = RNG.standard_normal((1, 24, 1, 1)).astype(np.float32)
    weight = RNG.standard_normal((6, 24, 1, 1)).astype(np.float32)
    b = RNG.standard_normal(6).astype(np.float32)
    args = {"x": x if layout == "c_order" else x.transpose(0, 2, 3, 1).copy().transpose(0, 3, 1, 2),
            "weight": weight, "strides": np.array([1, 1]), "dilations": np.array([1, 1]), "groups": np.int32(1),
            "pad_type": "valid", "pad": np.array([0, 0, 0, 0])}
    if bias:
        args["bias"] = b
    got = conv(_Op("conv"), args)
    expected = weight.reshape(6, 24).astype(np.float64) @ x.reshape(24) + (b if bias else 0)
    assert got.shape == (1, 6, 1, 1) and got.dtype == np.float32
    np.testing.assert_allclose(got.reshape(6), expected, rtol=1e-5, atol=1e-5)
