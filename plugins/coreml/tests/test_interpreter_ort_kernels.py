"""onnxruntime's convolutions for the validate stage's samples (``ort_kernels``): every geometry
(1-D, 2-D and 3-D; dense, grouped, depthwise and channel multipliers; strides, dilations,
asymmetric padding; batches; with and without bias; a fused activation; fp32 and fp16 programs)
agrees with the numpy kernels, and only the calls that asked for them take them: the thread inside
``for_calls``, a conv whose weights are the program's constants, an ``ArtifactRunner``'s samples, the
fp16 guard's runs. Outside, numpy's kernels compute every conv."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import Function, Program

from edgebuild_coreml.interpreter import ort_kernels, run_program
from edgebuild_coreml.interpreter.artifact_runner import ArtifactRunner
from edgebuild_coreml.interpreter.ops_conv import TORCH_POINTWISE_MIN_MACS
from interpreter_programs import saved

RNG = np.random.default_rng(11)


@pytest.fixture
def sessions(monkeypatch):
    """The threads each onnxruntime conv session was made in (one entry per session)."""
    made = []
    original = ort_kernels.conv_call

    def counting(*args, **kwargs):
        call = original(*args, **kwargs)
        if call is not None:
            made.append(threading.get_ident())
        return call

    monkeypatch.setattr(ort_kernels, "conv_call", counting)
    return made


def _program(x_shape, weight, bias, strides, dilations, pad, groups, relu=False, dtype=None):
    placeholders = {"x": mb.placeholder(shape=x_shape)}
    prog = Program()
    with Function(placeholders) as func:
        x = func.inputs["x"] if dtype is None else mb.cast(x=func.inputs["x"], dtype=dtype)
        w = weight if dtype is None else weight.astype(np.float16)
        kwargs = {} if bias is None else {"bias": bias if dtype is None else bias.astype(np.float16)}
        y = mb.conv(x=x, weight=w, strides=strides, dilations=dilations, pad_type="custom", pad=pad,
                    groups=groups, **kwargs)
        y = mb.relu(x=y) if relu else y
        func.set_outputs([y if dtype is None else mb.cast(x=y, dtype="fp32")])
        prog.add_function("main", func)
    return prog


# (input shape, weight shape, groups, strides, dilations, MIL pad)
GEOMETRIES = [
    ((1, 8, 13, 17), (12, 8, 3, 3), 1, [1, 1], [1, 1], [1, 1, 1, 1]),  # dense
    ((2, 8, 13, 17), (8, 2, 3, 1), 4, [2, 1], [1, 2], [0, 2, 1, 0]),  # grouped, asymmetric pads
    ((1, 16, 20, 18), (16, 1, 3, 3), 16, [1, 1], [1, 1], [1, 1, 1, 1]),  # depthwise
    ((1, 16, 20, 18), (16, 1, 5, 5), 16, [2, 2], [1, 1], [2, 2, 2, 2]),  # depthwise, strided
    ((2, 6, 9, 11), (12, 1, 3, 3), 6, [1, 2], [2, 1], [2, 1, 0, 3]),  # a channel multiplier
    ((1, 64, 28, 28), (128, 64, 1, 1), 1, [1, 1], [1, 1], [0, 0, 0, 0]),  # pointwise
    ((1, 32, 14, 14), (64, 32, 1, 1), 1, [2, 2], [1, 1], [0, 0, 0, 0]),  # a small pointwise one: numpy's
    ((1, 4, 40), (6, 4, 5), 1, [2], [3], [2, 1]),  # 1-D
    ((1, 8, 30), (8, 1, 3), 8, [1], [1], [1, 1]),  # 1-D depthwise
    ((1, 3, 6, 7, 5), (4, 3, 2, 3, 2), 1, [1, 2, 1], [1, 1, 2], [1, 0, 0, 1, 1, 1]),  # 3-D
]


def _macs(x_shape, w_shape, out) -> int:
    return int(np.prod(out.shape[2:])) * x_shape[0] * w_shape[0] * w_shape[1]


@pytest.mark.parametrize("x_shape, w_shape, groups, strides, dilations, pad", GEOMETRIES)
@pytest.mark.parametrize("bias, relu", [(True, False), (False, False), (True, True)])
def test_onnxruntime_convs_match_numpy_over_every_geometry(sessions, x_shape, w_shape, groups, strides, dilations,
                                                           pad, bias, relu):
    weight = (RNG.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
    b = RNG.standard_normal(w_shape[0]).astype(np.float32) if bias else None
    prog = _program(x_shape, weight, b, strides, dilations, pad, groups, relu=relu)
    x = {"x": RNG.standard_normal(x_shape).astype(np.float32)}
    [expected] = run_program(prog, x).values()
    assert sessions == []  # outside a block: numpy's kernels
    with ort_kernels.for_calls():
        [got] = run_program(prog, x).values()
        [again] = run_program(prog, x).values()
    small_pointwise = w_shape[2:] == (1,) * (len(w_shape) - 2) and _macs(x_shape, w_shape, expected) < TORCH_POINTWISE_MIN_MACS
    assert len(sessions) == (0 if small_pointwise else 1)  # one session for the op, kept for the next run
    assert got.shape == expected.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(again, got)
    if relu:
        assert got.min() >= 0
    [after] = run_program(prog, x).values()  # the block over: numpy's again, by the plan's own choice
    assert len(sessions) == (0 if small_pointwise else 1)
    np.testing.assert_allclose(after, expected, rtol=1e-6, atol=1e-6)


def test_a_thread_outside_the_block_keeps_numpy(sessions):
    """The fp16 guard of another build may run in another thread while a validation runs: its
    errors must not depend on that."""
    weight = RNG.standard_normal((8, 1, 3, 3)).astype(np.float32)
    prog = _program((1, 8, 12, 12), weight, None, [1, 1], [1, 1], [1, 1, 1, 1], 8)
    x = {"x": RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)}
    other = {}
    with ort_kernels.for_calls():
        assert ort_kernels.active()
        thread = threading.Thread(target=lambda: other.update(active=ort_kernels.active(), out=run_program(prog, x)))
        thread.start()
        thread.join()
    assert other["active"] is False and sessions == []
    with ort_kernels.for_calls():
        run_program(prog, x)
    assert sessions == [threading.get_ident()]


@pytest.mark.parametrize("relu", [False, True])
def test_an_fp16_programs_convs_widen_as_numpys_do(sessions, relu):
    """An fp16 program's conv computes on its input widened to fp32 and the result is rounded to
    fp16 once, on either kernels: the same values up to summation order."""
    weight = RNG.standard_normal((8, 4, 3, 3)).astype(np.float32) / 6
    bias = RNG.standard_normal(8).astype(np.float32)
    x = {"x": RNG.standard_normal((2, 4, 10, 10)).astype(np.float32)}
    half = _program((2, 4, 10, 10), weight, bias, [1, 1], [1, 1], [1, 0, 0, 1], 1, relu=relu, dtype="fp16")
    [expected] = run_program(half, x).values()
    with ort_kernels.for_calls():
        [got] = run_program(half, x).values()
    assert len(sessions) == 1
    np.testing.assert_allclose(got, expected, rtol=2e-3, atol=2e-3)  # an fp16 ulp where a sum lands on a tie
    assert np.mean(got == expected) > 0.95


def test_weights_computed_at_run_time_keep_numpy(sessions):
    weight = RNG.standard_normal((8, 4, 3, 3)).astype(np.float32)
    x = {"x": RNG.standard_normal((1, 4, 10, 10)).astype(np.float32)}

    placeholders = {"x": mb.placeholder(shape=(1, 4, 10, 10)), "scale": mb.placeholder(shape=(1,))}
    computed = Program()
    with Function(placeholders) as func:
        w = mb.mul(x=weight, y=func.inputs["scale"])  # computed from an input: a new array every run
        func.set_outputs([mb.conv(x=func.inputs["x"], weight=w)])
        computed.add_function("main", func)
    with ort_kernels.for_calls():
        [got] = run_program(computed, {**x, "scale": np.ones(1, np.float32)}).values()
    assert sessions == []
    [want] = run_program(_program((1, 4, 10, 10), weight, None, [1, 1], [1, 1], [0, 0, 0, 0], 1), x).values()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_an_artifact_runners_samples_take_them(sessions, tmp_path, monkeypatch):
    from edgebuild_coreml.interpreter import torch_kernels

    monkeypatch.setattr(torch_kernels, "_borrowed", False)  # torch's kernels not borrowed: they would come first
    weight = RNG.standard_normal((8, 1, 3, 3)).astype(np.float32)
    path = saved(_program((1, 8, 16, 16), weight, None, [1, 1], [1, 1], [1, 1, 1, 1], 8), tmp_path / "m.mlpackage")
    x = RNG.standard_normal((1, 8, 16, 16)).astype(np.float32)
    runner = ArtifactRunner(path)
    [got] = runner({"x": x}).values()
    assert len(sessions) == 1 and not ort_kernels.active()  # on for its calls alone
    [want] = run_program(_program((1, 8, 16, 16), weight, None, [1, 1], [1, 1], [1, 1, 1, 1], 8), {"x": x}).values()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_what_onnxruntime_does_not_compute_is_left_to_numpy():
    args = ((1, 4, 8, 8), np.ones((4, 4, 3, 3), np.float32), None, [1, 1], [1, 1], 1, [(1, 1), (1, 1)])
    assert ort_kernels.conv_call(*args) is not None
    assert ort_kernels.conv_call((1, 4, 8, 8), np.ones((4, 4, 3, 3), np.float16), *args[2:]) is None
    assert ort_kernels.conv_call((0, 4, 8, 8), *args[1:]) is None  # an empty batch
    assert ort_kernels.conv_call((1, 4, 8, 8, 8, 8), np.ones((4, 4, 3, 3, 3, 3), np.float32), None, [1] * 4,
                                 [1] * 4, 1, [(1, 1)] * 4) is None  # a spatial rank onnxruntime has no conv of


def test_the_fp16_guards_runs_take_onnxruntimes_convs(sessions):
    """The guard's reference and emulated runs compute convs by onnxruntime, its own choice
    whatever thread it runs in: its estimate reads what validation's kernels compute."""
    from edgebuild_coreml import fp16_guard

    weight = RNG.standard_normal((8, 4, 3, 3)).astype(np.float32) / 6
    prog = _program((1, 4, 10, 10), weight, None, [1, 1], [1, 1], [1, 1, 1, 1], 1)
    samples = [{"x": RNG.standard_normal((1, 4, 10, 10)).astype(np.float32)} for _ in range(2)]
    assert not ort_kernels.active()
    result = fp16_guard.find_overflows(prog, samples, cosine_min=0.999)
    assert sessions and set(sessions) == {threading.get_ident()}
    assert result.precision is not None and result.precision.fp16_cosine > 0.999
    assert not ort_kernels.active()  # the block ends with the guard


def test_a_weight_computed_at_run_time_keeps_numpy(sessions):
    """A session holds its weights: a conv whose weight is computed in the run would make one per
    run, so it stays on numpy's kernels, inside the block too."""
    weight = RNG.standard_normal((8, 4, 3, 3)).astype(np.float32) / 6
    prog = Program()
    with Function({"x": mb.placeholder(shape=(1, 4, 10, 10)), "w": mb.placeholder(shape=weight.shape)}) as func:
        func.set_outputs([mb.conv(x=func.inputs["x"], weight=func.inputs["w"], pad_type="same")])
        prog.add_function("main", func)
    x = RNG.standard_normal((1, 4, 10, 10)).astype(np.float32)
    with ort_kernels.for_calls():
        [got] = run_program(prog, {"x": x, "w": weight}).values()
    assert sessions == []
    [expected] = run_program(_program((1, 4, 10, 10), weight, None, [1, 1], [1, 1], [1, 1, 1, 1], 1), {"x": x}).values()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
