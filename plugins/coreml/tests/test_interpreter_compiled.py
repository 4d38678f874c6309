"""The interpreter's compiled path (closures over a slot array, runs without an observer)
against its generic loop (runs with one): same values, values dropped after their last reader,
constants swapped in place picked up, errors naming the op, and the functions it leaves to the
generic loop; several samples run op by op together give what each gives alone.
"""

from __future__ import annotations

import weakref

import numpy as np
import pytest

ct = pytest.importorskip("coremltools")
from coremltools.converters.mil import Builder as mb  # noqa: E402
from interpreter_programs import spec  # noqa: E402

from edgebuild.errors import BuildError  # noqa: E402
from edgebuild_coreml.interpreter import run_program  # noqa: E402
from edgebuild_coreml.interpreter.executor import run_program_samples  # noqa: E402
from edgebuild_coreml.interpreter.plan import plan_for  # noqa: E402
from edgebuild_coreml.interpreter.registry import EVALUATORS  # noqa: E402

RNG = np.random.default_rng(0)


def _conv_hard_swish_se():
    """A MobileNetV3 block as PaddleOCR's direction classifier has it: conv, hard-swish,
    squeeze-and-excite (global mean, 1x1 convs, hard-sigmoid gate)."""
    w = RNG.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3
    squeeze = RNG.standard_normal((4, 8, 1, 1)).astype(np.float32) * 0.3
    excite = RNG.standard_normal((8, 4, 1, 1)).astype(np.float32) * 0.3

    @mb.program(input_specs=[spec((1, 3, 12, 16))], opset_version=ct.target.iOS17)
    def prog(x):
        y = mb.conv(x=x, weight=w, strides=[2, 2], pad_type="same")
        y = mb.mul(x=y, y=mb.sigmoid_hard(x=y, alpha=np.float32(1 / 6), beta=np.float32(0.5)))
        pooled = mb.reduce_mean(x=y, axes=[2, 3], keep_dims=True)
        gate = mb.sigmoid_hard(x=mb.conv(x=mb.relu(x=mb.conv(x=pooled, weight=squeeze)), weight=excite),
                               alpha=np.float32(0.2), beta=np.float32(0.5))
        return mb.reduce_sum(x=mb.mul(x=y, y=gate), axes=[-1], keep_dims=False, name="out")

    return prog


@pytest.mark.parametrize("fp16", [False, True])
def test_compiled_path_gives_what_the_generic_loop_gives(fp16):
    prog = _conv_hard_swish_se()
    x = RNG.standard_normal((1, 3, 12, 16)).astype(np.float32)
    compiled = run_program(prog, {"x": x}, fp16=fp16)["out"]
    assert plan_for(prog.functions["main"], fp16=fp16).compiled_function(None, None) is not None
    generic = run_program(prog, {"x": x}, fp16=fp16, observer=lambda op, outputs: None)["out"]
    assert compiled.shape == (1, 8, 6) and compiled.dtype == np.float32
    np.testing.assert_allclose(compiled, generic, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fp16", [False, True])
def test_samples_run_together_give_what_each_gives_alone(fp16):
    prog = _conv_hard_swish_se()
    xs = [RNG.standard_normal((1, 3, 12, 16)).astype(np.float32) for _ in range(3)]
    given_twice = xs[0]
    kept = given_twice.copy()
    alone = [run_program(prog, {"x": x}, fp16=fp16)["out"] for x in xs]
    together = run_program_samples(prog, [{"x": x} for x in [*xs, given_twice]], fp16=fp16)
    assert [set(outputs) for outputs in together] == [{"out"}] * 4
    for outputs, expected in zip(together, [*alone, alone[0]]):
        np.testing.assert_allclose(outputs["out"], expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(given_twice, kept)  # a caller's input is never written into


def test_samples_run_together_go_op_by_op(monkeypatch):
    """Each op runs on every sample before the next op runs (its code stays in the CPU's caches)."""

    @mb.program(input_specs=[spec((2, 3))], opset_version=ct.target.iOS17)
    def prog(x):
        return mb.cos(x=mb.sin(x=x, name="a"), name="b")

    xs = [RNG.standard_normal((2, 3)).astype(np.float32) for _ in range(3)]
    run_program(prog, {"x": xs[0]})
    order = []
    for op_type in ("sin", "cos"):
        original = EVALUATORS[op_type]

        def recording(op, args, donated=(), original=original):
            order.append(op.name)
            return original(op, args, donated=donated)

        monkeypatch.setattr(EVALUATORS.entry(op_type), "obj", recording)
    together = run_program_samples(prog, [{"x": x} for x in xs])
    assert order == ["a"] * 3 + ["b"] * 3
    for outputs, x in zip(together, xs):
        np.testing.assert_allclose(outputs["b"], np.cos(np.sin(x)), rtol=1e-6)


def test_compiled_path_drops_values_after_their_last_reader(monkeypatch):
    @mb.program(input_specs=[spec((2, 3))], opset_version=ct.target.iOS17)
    def prog(x):
        a = mb.sin(x=x, name="a")
        b = mb.cos(x=a, name="b")
        c = mb.tanh(x=b, name="c")
        return mb.sub(x=c, y=b, name="d")  # b stays alive until d reads it

    x = RNG.standard_normal((2, 3)).astype(np.float32)
    run_program(prog, {"x": x})  # loads the evaluators, compiles
    alive, seen = {}, {}
    for op_type in ("sin", "cos", "tanh", "sub"):
        original = EVALUATORS[op_type]

        def tracking(op, args, donated=(), original=original):
            seen[op.name] = {name: ref() is not None for name, ref in alive.items()}
            result = original(op, args, donated=donated).copy()  # a new array each, however computed
            alive[op.name] = weakref.ref(result)
            return result

        monkeypatch.setattr(EVALUATORS.entry(op_type), "obj", tracking)
    (out,) = run_program(prog, {"x": x}).values()
    b = np.cos(np.sin(x))
    np.testing.assert_allclose(out, np.tanh(b) - b, rtol=1e-6)
    assert seen["c"] == {"a": False, "b": True}
    assert seen["d"] == {"a": False, "b": True, "c": True}


def test_compiled_path_sees_a_constant_swapped_in_place():
    """Compression's sensitivity analysis replaces a const's value between runs."""

    @mb.program(input_specs=[spec((4,))], opset_version=ct.target.iOS17)
    def prog(x):
        return mb.mul(x=x, y=np.full(4, 2.0, np.float32), name="out")

    x = np.arange(4, dtype=np.float32)
    np.testing.assert_allclose(run_program(prog, {"x": x})["out"], 2 * x)
    [const] = [op for op in prog.functions["main"].operations if op.op_type == "const"]
    const.outputs[0]._sym_val.val = np.full(4, 3.0, np.float32)
    np.testing.assert_allclose(run_program(prog, {"x": x})["out"], 3 * x)


def _conv_program():
    weight = np.arange(2 * 3 * 3 * 3, dtype=np.float32).reshape(2, 3, 3, 3) / 50

    @mb.program(input_specs=[spec((1, 3, 5, 5))], opset_version=ct.target.iOS17)
    def prog(x):
        return mb.conv(x=x, weight=weight, pad_type="same", name="out")

    return prog, weight


def _conv_reference(x, weight):
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))  # [1, C, 5, 5, 3, 3]
    return np.einsum("nchwij,fcij->nfhw", windows, weight)


def test_a_conv_step_calls_what_it_prepared_on_every_run_until_its_weight_is_swapped(monkeypatch):
    """The compiled step asks the conv evaluator for a call prepared for its constants and input
    shape before its first run, and keeps it: no run calls the evaluator itself (so the first run
    computes as the later ones do), and a weight swapped in place (compression's sensitivity
    analysis) is prepared for again."""
    prog, weight = _conv_program()
    x = np.random.default_rng(0).standard_normal((1, 3, 5, 5)).astype(np.float32)
    np.testing.assert_allclose(run_program(prog, {"x": x})["out"], _conv_reference(x, weight), rtol=1e-5, atol=1e-5)
    entry = EVALUATORS.entry("conv")
    calls, prepared = [], []
    evaluator = entry.obj

    def counted(op, args, **kwargs):
        calls.append(op.name)
        return evaluator(op, args, **kwargs)

    def prepare(op, args, *rest):
        prepared.append(op.name)
        return evaluator.prepare(op, args, *rest)

    counted.prepare = prepare
    monkeypatch.setattr(entry, "obj", counted)  # a new evaluator: prepared again before its first run
    for _ in range(3):
        np.testing.assert_allclose(run_program(prog, {"x": x})["out"], _conv_reference(x, weight), rtol=1e-5, atol=1e-5)
    assert (calls, prepared) == ([], ["out"])
    [const] = [op for op in prog.functions["main"].operations if op.op_type == "const" and np.ndim(op.outputs[0].val) == 4]
    const.outputs[0]._sym_val.val = swapped = weight * -2
    np.testing.assert_allclose(run_program(prog, {"x": x})["out"], _conv_reference(x, swapped), rtol=1e-5, atol=1e-5)
    assert (calls, prepared) == ([], ["out", "out"])


def test_compiled_path_names_the_op_of_a_wrong_shape(monkeypatch):
    @mb.program(input_specs=[spec((2, 3))], opset_version=ct.target.iOS17)
    def prog(x):
        return mb.exp(x=x, name="the_exp")

    x = np.zeros((2, 3), np.float32)
    run_program(prog, {"x": x})
    monkeypatch.setattr(EVALUATORS.entry("exp"), "obj", lambda op, args, donated=(): np.zeros((3, 2), np.float32))
    with pytest.raises(BuildError, match=r"'the_exp' \(exp\) produced shape \(3, 2\)"):
        run_program(prog, {"x": x})


def test_control_flow_stays_on_the_generic_loop():
    @mb.program(input_specs=[spec((2,))], opset_version=ct.target.iOS17)
    def prog(x):
        return mb.cond(pred=mb.greater(x=mb.reduce_sum(x=x), y=np.float32(0)), _true_fn=lambda: mb.exp(x=x), _false_fn=lambda: mb.abs(x=x))

    out = run_program(prog, {"x": np.array([1.0, 2.0], np.float32)})
    np.testing.assert_allclose(next(iter(out.values())), np.exp([1.0, 2.0]), rtol=1e-6)
    assert plan_for(prog.functions["main"], fp16=False).compiled_function(None, None) is None
    together = run_program_samples(prog, [{"x": np.array(v, np.float32)} for v in ([1.0, 2.0], [-1.0, -3.0])])
    np.testing.assert_allclose(next(iter(together[0].values())), np.exp([1.0, 2.0]), rtol=1e-6)
    np.testing.assert_allclose(next(iter(together[1].values())), [1.0, 3.0], rtol=1e-6)


@pytest.mark.parametrize("axes, keep_dims", [([2, 3], True), ([-1], False), ([0, 1, 2, 3], False), ([1], True)])
def test_sum_and_mean_over_trailing_axes(axes, keep_dims):
    x = RNG.standard_normal((2, 5, 4, 6)).astype(np.float32)

    @mb.program(input_specs=[spec((2, 5, 4, 6))], opset_version=ct.target.iOS17)
    def prog(x):
        return (mb.reduce_sum(x=x, axes=axes, keep_dims=keep_dims, name="s"),
                mb.reduce_mean(x=x, axes=axes, keep_dims=keep_dims, name="m"))

    laid_last = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    strided = np.repeat(x, 2, axis=3)[..., ::2]  # neither layout: the evaluator's general path
    # the first run prepares each step's call, the later ones call it, whatever the input's layout
    for given in (x, x, laid_last, strided, x):
        out = run_program(prog, {"x": given})
        np.testing.assert_allclose(out["s"], x.sum(axis=tuple(axes), keepdims=keep_dims), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out["m"], x.mean(axis=tuple(axes), keepdims=keep_dims), rtol=1e-5, atol=1e-6)
