"""torch's kernels (oneDNN) against the interpreter's numpy kernels: every 2-D conv geometry the
torch path takes (strides, dilations, groups from dense to depthwise, padding modes, 1x1 convs large
and small, fused activations, both input layouts), ``linear`` and ``matmul`` by a matrix,
``softmax`` over each axis, fp16 operands; and ``for_calls``, which turns torch's kernels on for
the validate stage's calls in the build's own process and back off after them."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from edgebuild_coreml.interpreter import torch_kernels
from edgebuild_coreml.interpreter.fusion import Activation
from edgebuild_coreml.interpreter.ops_activation import softmax
from edgebuild_coreml.interpreter.ops_conv import TORCH_POINTWISE_MIN_MACS, conv
from edgebuild_coreml.interpreter.ops_linear import linear, matmul

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(7)


class _Op:
    """A stand-in for a MIL op: the evaluators read its type and name, and keep caches on it."""

    def __init__(self, op_type):
        self.op_type, self.name = op_type, op_type


def _both(compute):
    """(numpy kernels' result, torch kernels' result) of ``compute()``, each on a fresh op."""
    torch_kernels.disable()
    expected = compute(_Op("numpy"))
    assert torch_kernels.enable(threads=1)
    try:
        got = compute(_Op("torch"))
    finally:
        torch_kernels.disable()
    return expected, got


def _channels_last(array):
    return np.ascontiguousarray(array.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


def _conv_args(x, c_out, kernel, strides, dilations, groups, pad_type, pad, bias=True):
    weight = (RNG.standard_normal((c_out, x.shape[1] // groups, *kernel)) / np.sqrt(x.shape[1] // groups * np.prod(kernel)))
    args = {"x": x, "weight": weight.astype(np.float32), "strides": np.array(strides),
            "dilations": np.array(dilations), "groups": np.int32(groups), "pad_type": pad_type, "pad": np.array(pad)}
    if bias:
        args["bias"] = RNG.standard_normal(c_out).astype(np.float32)
    return args


# (input shape, output channels, groups): dense, grouped, depthwise, a channel multiplier
CHANNELS = [((1, 8, 13, 17), 12, 1), ((1, 8, 13, 17), 8, 4), ((1, 8, 13, 17), 8, 8), ((2, 6, 9, 11), 12, 6)]
GEOMETRIES = list(itertools.product([(3, 3), (1, 3), (5, 5)], [(1, 1), (2, 2), (2, 1)], [(1, 1), (2, 1)]))
PADDINGS = [("valid", [0, 0, 0, 0]), ("same", [0, 0, 0, 0]), ("same_lower", [0, 0, 0, 0]),
            ("custom", [1, 1, 1, 1]), ("custom", [0, 2, 1, 0])]


@pytest.mark.parametrize("shape, c_out, groups", CHANNELS)
@pytest.mark.parametrize("kernel, strides, dilations", GEOMETRIES)
@pytest.mark.parametrize("pad_type, pad", PADDINGS)
def test_torch_conv_matches_numpy_over_every_geometry(shape, c_out, groups, kernel, strides, dilations, pad_type, pad):
    x = RNG.standard_normal(shape).astype(np.float32)
    args = _conv_args(x, c_out, kernel, strides, dilations, groups, pad_type, pad)
    expected, got = _both(lambda op: conv(op, args))
    assert torch_kernels.channels_last(got) or got.shape[1] == 1 or got[0, 0].size == 1  # oneDNN's layout kept
    assert got.shape == expected.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["c_order", "channels_last"])
@pytest.mark.parametrize("activation", [None, Activation("relu"), Activation("hard_swish", float(np.float32(1 / 6)), 0.5),
                                        Activation("hard_swish", 0.2, 0.5), Activation("hard_sigmoid", 0.2, 0.5)])
@pytest.mark.parametrize("kernel, groups, bias", [((3, 3), 1, True), ((3, 3), 16, True), ((1, 1), 1, True),
                                                  ((1, 1), 1, False), ((5, 5), 16, False)])
def test_fused_activations_and_layouts_match_numpy(layout, activation, kernel, groups, bias):
    x = RNG.standard_normal((1, 16, 40, 36)).astype(np.float32)
    pad = [k // 2 for k in kernel for _ in range(2)]
    args = _conv_args(_channels_last(x) if layout == "channels_last" else x, 32 if groups == 1 else 16, kernel,
                      [1, 1], [1, 1], groups, "custom", pad, bias=bias)
    expected, got = _both(lambda op: conv(op, args, activation=activation))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pixels, c_in, c_out", [(1, 512, 128), (12 * 16, 32, 200), (28 * 28, 64, 128), (56 * 56, 32, 64)])
@pytest.mark.parametrize("strides", [(1, 1), (2, 2)])
def test_pointwise_convs_take_torch_only_when_large(pixels, c_in, c_out, strides):
    side = int(np.sqrt(pixels))
    shape = (1, c_in, side, pixels // side)
    x = RNG.standard_normal(shape).astype(np.float32)
    args = _conv_args(x, c_out, (1, 1), strides, [1, 1], 1, "valid", [0, 0, 0, 0])
    expected, got = _both(lambda op: conv(op, args))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    out_pixels = int(np.prod(got.shape[2:]))
    large = out_pixels * c_in * c_out >= TORCH_POINTWISE_MIN_MACS
    assert torch_kernels.channels_last(got) == (large and out_pixels > 1)  # numpy's C order below the threshold


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_convs_of_other_float_types_keep_numpy_semantics(dtype):
    x = RNG.standard_normal((1, 8, 12, 12)).astype(dtype)
    args = _conv_args(x, 8, (3, 3), [1, 1], [1, 1], 8, "same", [0, 0, 0, 0])
    args["weight"] = args["weight"].astype(dtype)
    expected, got = _both(lambda op: conv(op, args))
    assert got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape, n", [((1, 128, 384), 1536), ((128, 1536), 384), ((2, 3, 64, 96), 80), ((4, 8), 3)])
@pytest.mark.parametrize("bias", [True, False])
def test_torch_linear_matches_numpy(shape, n, bias):
    x = {"x": RNG.standard_normal(shape).astype(np.float32),
         "weight": (RNG.standard_normal((n, shape[-1])) / np.sqrt(shape[-1])).astype(np.float32)}
    if bias:
        x["bias"] = RNG.standard_normal(n).astype(np.float32)
    expected, got = _both(lambda op: linear(op, x))
    assert got.shape == expected.shape == (*shape[:-1], n) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("a_shape, b_shape", [((1, 128, 384), (384, 1536)), ((128, 384), (384, 96)),
                                              ((1, 12, 128, 32), (1, 12, 32, 128)), ((3, 64, 80), (80,))])
@pytest.mark.parametrize("transpose_x, transpose_y", [(False, False), (False, True), (True, False), (True, True)])
def test_torch_matmul_by_a_matrix_matches_numpy(a_shape, b_shape, transpose_x, transpose_y):
    a = RNG.standard_normal(a_shape).astype(np.float32)
    b = RNG.standard_normal(b_shape).astype(np.float32) / np.sqrt(b_shape[0])
    if transpose_x and a.ndim >= 2:
        a = np.ascontiguousarray(np.swapaxes(a, -1, -2))
    if transpose_y and b.ndim >= 2:
        b = np.ascontiguousarray(np.swapaxes(b, -1, -2))
    x = {"x": a, "y": b, "transpose_x": np.bool_(transpose_x), "transpose_y": np.bool_(transpose_y)}
    expected, got = _both(lambda op: matmul(op, x))
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5)


def test_integer_matmul_stays_exact():
    a, b = RNG.integers(-50, 50, (64, 96), dtype=np.int32), RNG.integers(-50, 50, (96, 128), dtype=np.int32)
    expected, got = _both(lambda op: matmul(op, {"x": a, "y": b}))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("axis", [-1, 0, 1, 2, 3])
def test_torch_softmax_matches_numpy(axis):
    x = (RNG.standard_normal((2, 12, 32, 40)) * 8).astype(np.float32)
    expected, got = _both(lambda op: softmax(op, {"x": x, "axis": np.int32(axis)}))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got.sum(axis=axis), 1.0, rtol=1e-5)


def test_fp16_softmax_is_computed_in_float32():
    x = (RNG.standard_normal((1, 4, 64, 64)) * 4).astype(np.float16)
    expected, got = _both(lambda op: softmax(op, {"x": x, "axis": np.int32(-1)}))
    assert got.dtype == expected.dtype == np.float32  # widened: the executor rounds the result once
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


@pytest.fixture
def numpy_kernels():
    torch_kernels.disable()
    yield
    torch_kernels.disable()


def test_for_calls_turns_torch_on_for_the_block_and_restores_the_pool(numpy_kernels):
    threads = torch.get_num_threads()
    with torch_kernels.for_calls(threads=1):
        assert torch_kernels.enabled() and torch.get_num_threads() == 1
        with torch_kernels.for_calls(threads=1):  # nested (another thread's call): still on
            assert torch_kernels.enabled()
        assert torch_kernels.enabled()
    assert not torch_kernels.enabled() and torch.get_num_threads() == threads


def test_for_calls_leaves_kernels_turned_on_for_good_alone(numpy_kernels):
    torch_kernels.enable()
    threads = torch.get_num_threads()
    with torch_kernels.for_calls(threads=1):
        assert torch_kernels.enabled()
    assert torch_kernels.enabled() and torch.get_num_threads() == threads


def test_for_calls_turns_torch_on_for_the_calling_thread_alone(numpy_kernels):
    import threading

    seen, inside, leave = [], threading.Event(), threading.Event()

    def validating():
        with torch_kernels.for_calls(threads=1):
            seen.append(("validating", torch_kernels.enabled()))
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=validating)
    thread.start()
    assert inside.wait(10)
    seen.append(("other", torch_kernels.enabled()))  # e.g. the fp16 guard of another stage
    x = RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)
    args = _conv_args(x, 8, (3, 3), [1, 1], [1, 1], 8, "same", [0, 0, 0, 0])
    assert conv(_Op("other"), args).flags.c_contiguous  # numpy's kernel, not oneDNN's channels-last one
    leave.set()
    thread.join()
    assert seen == [("validating", True), ("other", False)]


def test_for_calls_restores_after_an_error(numpy_kernels):
    threads = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="boom"):
        with torch_kernels.for_calls(threads=1):
            raise RuntimeError("boom")
    assert not torch_kernels.enabled() and torch.get_num_threads() == threads


def _dequantized_matmuls():
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb
    from interpreter_programs import spec

    weights = [RNG.integers(-8, 8, (32, 32), dtype=np.int8) for _ in range(3)]

    @mb.program(input_specs=[spec((4, 32))], opset_version=ct.target.iOS16)
    def prog(x):
        for w in weights:
            dense = mb.constexpr_affine_dequantize(quantized_data=w, zero_point=np.int8(1), scale=np.float32(0.25), axis=0)
            x = mb.relu(x=mb.matmul(x=x, y=dense))
        return mb.identity(x=x, name="out")

    return prog


@pytest.mark.parametrize("fp16", [False, True])
def test_compressed_weights_are_expanded_into_the_compiled_template_once(monkeypatch, fp16):
    from edgebuild_coreml.interpreter.executor import run_program, run_program_samples
    from edgebuild_coreml.interpreter.plan import plan_for
    from edgebuild_coreml.interpreter.registry import EVALUATORS

    prog = _dequantized_matmuls()
    x = RNG.standard_normal((4, 32)).astype(np.float32)
    run_program(prog, {"x": x})  # loads the evaluators
    entry = EVALUATORS.entry("constexpr_affine_dequantize")
    expand, calls = entry.obj, []
    monkeypatch.setattr(entry, "obj", lambda op, args: calls.append(op.name) or expand(op, args))
    fresh = _dequantized_matmuls()
    generic = run_program(fresh, {"x": x}, fp16=fp16, observer=lambda op, outputs: None)["out"]  # the generic loop
    compiled = [run_program(fresh, {"x": x}, fp16=fp16)["out"] for _ in range(2)]
    together = run_program_samples(fresh, [{"x": x}] * 2, fp16=fp16)
    assert plan_for(fresh.functions["main"], fp16=fp16).compiled_function(None, None) is not None
    assert len(calls) == 3  # each weight expanded once, by the first run, then kept with the plan
    for got in [*compiled, *(outputs["out"] for outputs in together)]:
        np.testing.assert_array_equal(got, generic)


@pytest.mark.parametrize("layout", ["c_order", "channels_last"])
@pytest.mark.parametrize("donated", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_torch_silu_matches_numpy(layout, donated, dtype):
    from edgebuild_coreml.interpreter.ops_activation import silu

    x = (RNG.standard_normal((1, 24, 52, 52)) * 6).astype(dtype)
    x = _channels_last(x) if layout == "channels_last" else x
    written = []

    def compute(op):
        given = x.copy() if layout == "c_order" else _channels_last(np.ascontiguousarray(x))
        result = silu(op, {"x": given}, donated={"x"} if donated else set())
        written.append(result is given)
        return result

    expected, got = _both(compute)
    assert written[1] == (donated and dtype == np.float32)  # a float32 input nobody else holds is overwritten
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
