"""torch's kernels in the interpreter (validation's worker processes use them) give what numpy's do:
fp16 casts bit for bit, convolutions up to summation order."""

from __future__ import annotations

import numpy as np
import pytest
from edgebuild_coreml.interpreter import torch_kernels
from edgebuild_coreml.interpreter.ops_conv import conv

torch = pytest.importorskip("torch")



def on_torch_kernels(compute):
    """``compute()`` with torch's kernels on, on one thread as a worker runs them; torch's pool restored."""
    threads = torch.get_num_threads()
    torch_kernels.enable(threads=1)
    try:
        return compute()
    finally:
        torch_kernels.disable()
        torch.set_num_threads(threads)

@pytest.fixture
def enabled():
    threads = torch.get_num_threads()
    assert torch_kernels.enable(threads=1)
    yield
    torch_kernels.disable()
    torch.set_num_threads(threads)


def test_half_casts_match_numpy_bit_for_bit(enabled):
    every_half = np.arange(1 << 16, dtype=np.uint16).view(np.float16)  # normals, subnormals, infs, NaNs
    np.testing.assert_array_equal(torch_kernels.cast(every_half, np.float32), every_half.astype(np.float32))
    rng = np.random.default_rng(0)
    wide = np.concatenate([rng.standard_normal(50_000) * 10.0 ** rng.integers(-9, 6, 50_000),
                           [65504, 65519.99, 65520, -65520, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, -0.0]])
    wide = wide.astype(np.float32)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(torch_kernels.cast(wide, np.float16), wide.astype(np.float16))
    assert torch_kernels.cast(wide, np.float16).base is None  # numpy's own: later ops may write into it


def test_half_casts_of_strided_arrays_match_numpy(enabled):
    # a channels-last map, a transposed one, a strided slice; a reversed view stays numpy's
    maps = np.random.default_rng(3).standard_normal((1, 8, 24, 96)).astype(np.float16)
    for view in (maps.transpose(0, 2, 3, 1).copy().transpose(0, 3, 1, 2), maps.transpose(0, 1, 3, 2),
                 maps[:, :, ::2, 1::3], maps[:, :, ::-1]):
        widened = torch_kernels.cast(view, np.float32)
        np.testing.assert_array_equal(widened, view.astype(np.float32))
        assert widened.base is None and widened.flags.writeable


class _Conv:
    op_type, name = "conv", "conv"


@pytest.mark.parametrize("shape, weight, strides, dilations, pad, groups", [
    ((1, 16, 14, 14), (16, 1, 5, 5), [1, 1], [1, 1], [2, 2, 2, 2], 16),  # depthwise, small map
    ((1, 8, 40, 40), (8, 1, 3, 3), [2, 2], [1, 1], [0, 1, 0, 1], 8),  # strided depthwise, asymmetric pads
    ((2, 3, 23, 19), (6, 3, 3, 3), [2, 1], [1, 2], [1, 0, 2, 1], 1),  # im2col
    ((1, 6, 9, 9), (4, 3, 2, 2), [1, 1], [1, 1], [0, 0, 0, 0], 2),  # grouped
])
def test_torch_conv_matches_numpy_conv(shape, weight, strides, dilations, pad, groups):
    rng = np.random.default_rng(1)
    x = {"x": rng.standard_normal(shape).astype(np.float32), "weight": rng.standard_normal(weight).astype(np.float32),
         "bias": rng.standard_normal(weight[0]).astype(np.float32), "strides": np.array(strides),
         "dilations": np.array(dilations), "pad_type": "custom", "pad": np.array(pad), "groups": np.int32(groups)}
    mine = conv(_Conv(), x)
    theirs = on_torch_kernels(lambda: conv(_Conv(), x))
    np.testing.assert_allclose(theirs, mine, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["none", "tanh"])
def test_torch_gelu_and_erf_match_the_float64_reference(enabled, mode):
    from edgebuild.reference.activations import gelu
    from edgebuild.reference.special import erf

    x = np.concatenate([np.linspace(-9, 9, 20_001), [0.0, -0.0, 1e-30, 40.0, -40.0]]).astype(np.float32)
    # absolute: below x = -4 float32's 1 + erf cancels (as float32 hardware's does), GELU there is ~1e-6
    np.testing.assert_allclose(torch_kernels.gelu(x, mode), gelu(x, mode), rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(torch_kernels.erf(x), erf(x), rtol=2e-6, atol=1e-7)
    assert torch_kernels.gelu(x, "sigmoid") is None  # left to the numpy reference


def test_a_depthwise_weight_packed_for_its_input_shape_gives_the_plain_conv(enabled):
    if not torch_kernels.fuses_activations():
        pytest.skip("torch without oneDNN's convolution")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 8, 12, 10)).astype(np.float32)
    weight, bias = rng.standard_normal((8, 1, 3, 3)).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    geometry = ([2, 1], [1, 1], [(1, 0), (1, 1)], 8)  # asymmetric pads: the input is padded first
    packed = torch_kernels.conv2d_prepared(weight, bias, *geometry, input_shape=x.shape)
    plain = torch_kernels.conv2d_prepared(weight, bias, *geometry)
    assert packed[-1][0] == (1, 8, 13, 12) and plain[-1] is None  # packed for the padded input
    np.testing.assert_allclose(torch_kernels.conv2d(x, packed), torch_kernels.conv2d(x, plain), rtol=1e-6, atol=1e-6)
    other = x[:, :, :7].copy()  # another shape: the weight as it is
    np.testing.assert_allclose(torch_kernels.conv2d(other, packed), torch_kernels.conv2d(other, plain),
                               rtol=1e-6, atol=1e-6)


def test_channels_last_of_a_4d_array_is_read_from_its_strides_as_numpy_would_lay_it_out():
    import itertools

    def transposed_flags(array):  # the definition: [N, *spatial, C] is C-ordered, [N, C, ...] is not
        return not array.flags.c_contiguous and array.transpose(0, 2, 3, 1).flags.c_contiguous

    rng = np.random.default_rng(3)
    for shape in itertools.product([1, 2, 3], repeat=4):
        base = rng.standard_normal(shape).astype(np.float32)
        for order in itertools.permutations(range(4)):
            laid = np.ascontiguousarray(base.transpose(order)).transpose(np.argsort(order))
            for view in (laid, laid[:, :, ::2], laid[..., ::-1], laid[:1], np.asfortranarray(base)):
                assert torch_kernels.channels_last(view) == transposed_flags(view), (shape, order, view.strides)
