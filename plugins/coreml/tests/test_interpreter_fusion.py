"""Convs and the activation after them run as one step of the compiled plan (``fusion``): which
pairs fuse, and that the fused step gives what the ops give one by one (the generic loop, which
runs with an observer, never fuses), with numpy's kernels and with torch's."""

from __future__ import annotations

import numpy as np
import pytest

ct = pytest.importorskip("coremltools")
from coremltools.converters.mil import Builder as mb  # noqa: E402
from interpreter_programs import spec  # noqa: E402

from edgebuild_coreml.interpreter import run_program, torch_kernels  # noqa: E402
from edgebuild_coreml.interpreter.fusion import Activation, apply_in_place, conv_activations  # noqa: E402

RNG = np.random.default_rng(5)
SIXTH = np.float32(1 / 6)


def _weight(*shape):
    return (RNG.standard_normal(shape) * 0.3).astype(np.float32)


def _hard_swish(x, name=None):
    gate = mb.sigmoid_hard(x=x, alpha=SIXTH, beta=np.float32(0.5))
    return mb.mul(x=x, y=gate, name=name) if name else mb.mul(x=gate, y=x)


def _mobilenet_block(shape=(1, 3, 12, 16)):
    """A stem conv and hard-swish, a depthwise conv and ReLU, a 1x1 conv and a hard-swish of other
    constants (not oneDNN's), a squeeze-and-excite gate (a 1x1 conv, then hard-sigmoid), then a
    1x1 conv whose output is also read by an add (no fusion)."""
    c = shape[1]

    @mb.program(input_specs=[spec(shape)], opset_version=ct.target.iOS17)
    def prog(x):
        y = _hard_swish(mb.conv(x=x, weight=_weight(8, c, 3, 3), bias=_weight(8), strides=[2, 2], pad_type="same"))
        y = mb.relu(x=mb.conv(x=y, weight=_weight(8, 1, 3, 3), groups=8, pad_type="same"))
        z = mb.conv(x=y, weight=_weight(16, 8, 1, 1), bias=_weight(16))
        z = mb.mul(x=z, y=mb.sigmoid_hard(x=z, alpha=np.float32(0.2), beta=np.float32(0.4)))
        gate = mb.sigmoid_hard(x=mb.conv(x=mb.reduce_mean(x=z, axes=[2, 3], keep_dims=True), weight=_weight(16, 16, 1, 1),
                                         bias=_weight(16)), alpha=np.float32(0.2), beta=np.float32(0.5))
        w = mb.conv(x=mb.mul(x=z, y=gate), weight=_weight(16, 16, 1, 1))
        return mb.add(x=mb.relu(x=w), y=w, name="out")

    return prog


def _fused_kinds(prog, fp16=False):
    fused = conv_activations(prog.functions["main"], fp16=fp16)
    return sorted((f.activation.kind, tuple(op.op_type for op in f.ops)) for f in fused.values())


def test_activations_after_a_conv_fuse_where_nothing_else_reads_the_conv():
    assert _fused_kinds(_mobilenet_block()) == [("hard_sigmoid", ("sigmoid_hard",)),
                                                 ("hard_swish", ("sigmoid_hard", "mul")),
                                                 ("hard_swish", ("sigmoid_hard", "mul")),
                                                 ("relu", ("relu",))]


def test_hard_swish_stays_unfused_under_fp16_emulation_a_relu_does_not():
    # the gate is rounded to fp16 before the product there; a ReLU commutes with that rounding
    assert _fused_kinds(_mobilenet_block(), fp16=True) == [("relu", ("relu",))]


def test_a_conv_that_is_a_function_output_or_gates_another_value_stays_unfused():
    @mb.program(input_specs=[spec((1, 4, 6, 6))], opset_version=ct.target.iOS17)
    def prog(x):
        a = mb.conv(x=x, weight=_weight(4, 4, 1, 1), name="a")
        gated = mb.mul(x=x, y=mb.sigmoid_hard(x=a, alpha=SIXTH, beta=np.float32(0.5)))  # gates x, not a
        b = mb.conv(x=gated, weight=_weight(4, 4, 1, 1), name="b")
        return a, mb.relu(x=b, name="c"), b

    assert _fused_kinds(prog) == []


@pytest.fixture(params=["numpy", "torch"])
def kernels(request):
    if request.param == "numpy":
        yield request.param
        return
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    assert torch_kernels.enable(threads=1)
    yield request.param
    torch_kernels.disable()
    torch.set_num_threads(threads)


@pytest.mark.parametrize("fp16", [False, True])
def test_fused_steps_give_what_the_ops_give_one_by_one(kernels, fp16):
    prog = _mobilenet_block()
    x = RNG.standard_normal((1, 3, 12, 16)).astype(np.float32)
    fused = run_program(prog, {"x": x}, fp16=fp16)["out"]
    one_by_one = run_program(prog, {"x": x}, fp16=fp16, observer=lambda op, outputs: None)["out"]
    assert fused.shape == (1, 16, 6, 8)
    np.testing.assert_allclose(fused, one_by_one, rtol=1e-5, atol=1e-5)


def test_a_fused_conv_keeps_a_channels_last_input_and_output(kernels):
    """ppocr_cls's depthwise convs see (and give) channels-last maps under torch's kernels."""
    prog = _mobilenet_block((1, 8, 24, 96))
    x = RNG.standard_normal((1, 8, 24, 96)).astype(np.float32)
    x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    fused = run_program(prog, {"x": x})["out"]
    one_by_one = run_program(prog, {"x": x}, observer=lambda op, outputs: None)["out"]
    np.testing.assert_allclose(fused, one_by_one, rtol=1e-5, atol=1e-5)


def test_activations_in_place_match_numpy_reference():
    x = RNG.standard_normal((2, 5, 7, 3)).astype(np.float32) * 4
    np.testing.assert_array_equal(apply_in_place(Activation("relu"), x.copy()), np.maximum(x, 0))
    gate = np.clip(x * np.float32(0.2) + np.float32(0.4), 0, 1)
    np.testing.assert_allclose(apply_in_place(Activation("hard_swish", 0.2, 0.4), x.copy()), x * gate,
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(apply_in_place(Activation("hard_sigmoid", 0.2, 0.4), x.copy()), gate,
                               rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("activation", ["relu", "hard_swish"])
@pytest.mark.parametrize("groups", [1, 6])
def test_torch_conv_with_a_fused_activation_matches_numpy(activation, groups):
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    assert torch_kernels.enable(threads=1)
    try:
        if not torch_kernels.fuses_activations():
            pytest.skip("torch without oneDNN's fused convolution")
        x = RNG.standard_normal((1, 6, 9, 11)).astype(np.float32) * 2
        weight, bias = _weight(6, 6 // groups, 3, 3), _weight(6)
        prepared = torch_kernels.conv2d_prepared(weight, bias, [2, 1], [1, 1], [(1, 0), (1, 1)], groups, activation)
        got = torch_kernels.conv2d(x, prepared)
        plain = torch_kernels.conv2d(x, torch_kernels.conv2d_prepared(weight, bias, [2, 1], [1, 1], [(1, 0), (1, 1)], groups))
    finally:
        torch_kernels.disable()
        torch.set_num_threads(threads)
    expected = apply_in_place(Activation(activation, float(SIXTH), 0.5), plain.copy())
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_relu_by_clip_is_numpys_maximum_with_nans_infinities_and_layout_kept(dtype):
    from edgebuild_coreml.interpreter.fusion import relu

    x = (RNG.standard_normal((1, 6, 5, 7)) * 3).astype(dtype)
    x.flat[:4] = [np.nan, -np.inf, np.inf, -0.0]
    laid_last = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(relu(laid_last), np.maximum(x, 0))
    assert relu(laid_last).strides == laid_last.strides
    in_place = laid_last.copy(order="K")
    assert relu(in_place, in_place) is in_place
    np.testing.assert_array_equal(in_place, np.maximum(x, 0))
