"""The MIL interpreter's executor: precision, input checks, errors naming the op, releasing
values after their last reader, expanded-weight caching across runs, in-place ops, and
the runtime reading a package once.
"""

from __future__ import annotations

import numpy as np
import pytest

ct = pytest.importorskip("coremltools")
from coremltools.converters.mil import Builder as mb  # noqa: E402
from coremltools.converters.mil.mil import types  # noqa: E402
from interpreter_programs import FP16, saved, spec  # noqa: E402

from edgebuild.errors import BuildError  # noqa: E402
from edgebuild_coreml.interpreter import load_mlpackage, run_mlpackage, run_program  # noqa: E402
from edgebuild_coreml.interpreter.registry import EVALUATORS  # noqa: E402

RNG = np.random.default_rng(0)


def test_fp16_program_rounds_like_fp16(tmp_path):
    x = RNG.uniform(-4, 4, (64,)).astype(np.float32)
    y = RNG.uniform(-4, 4, (64,)).astype(np.float32)

    @mb.program(input_specs=[spec((64,)), spec((64,))], opset_version=ct.target.iOS17)
    def prog(x, y):
        return mb.mul(x=mb.add(x=x, y=y), y=x, name="out")

    path = saved(prog, tmp_path / "h.mlpackage", precision=FP16)
    assert any(op.op_type == "cast" for op in load_mlpackage(path).functions["main"].operations)
    out = run_mlpackage(path, {"x": x, "y": y})["out"]
    h = np.float16
    expected = ((x.astype(h) + y.astype(h)) * x.astype(h)).astype(np.float32)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, expected)
    assert not np.array_equal(out, (x + y) * x)  # fp16 rounding is really visible


def test_fp16_flag_emulates_half_precision_on_fp32_program(tmp_path):
    x = RNG.uniform(-4, 4, (64,)).astype(np.float32)

    @mb.program(input_specs=[spec((64,))], opset_version=ct.target.iOS17)
    def prog(x):
        return mb.mul(x=mb.exp(x=x), y=3.0, name="out")

    path = saved(prog, tmp_path / "f.mlpackage")
    exact = run_mlpackage(path, {"x": x})["out"]
    halved = run_mlpackage(path, {"x": x}, fp16=True)["out"]
    np.testing.assert_allclose(exact, np.exp(x) * 3, rtol=1e-6)
    h = np.float16
    expected = (np.exp(x.astype(h).astype(np.float32)).astype(h).astype(np.float32) * 3).astype(h).astype(np.float32)
    np.testing.assert_array_equal(halved, expected)


def test_inputs_cast_to_declared_dtype_and_checked():
    @mb.program(input_specs=[spec((2,), types.int32)], opset_version=ct.target.iOS17)
    def prog(x):
        return mb.add(x=x, y=1, name="out")

    out = run_program(prog, {"x": np.array([1.0, 2.0])})["out"]
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, [2, 3])
    with pytest.raises(BuildError, match="shape"):
        run_program(prog, {"x": np.zeros(3)})
    with pytest.raises(BuildError, match="'x'"):
        run_program(prog, {})


def test_missing_evaluator_names_op_type_and_op(monkeypatch):
    @mb.program(input_specs=[spec((2,))], opset_version=ct.target.iOS17)
    def prog(x):
        return mb.exp(x=x, name="the_exp")

    run_program(prog, {"x": np.zeros(2, np.float32)})  # loads evaluators
    monkeypatch.setattr(EVALUATORS.entry("exp"), "obj", None)
    with pytest.raises(BuildError, match=r"'exp'.*'the_exp'"):
        run_program(prog, {"x": np.zeros(2, np.float32)})


def test_evaluator_failure_is_a_build_error_naming_the_op():
    @mb.program(input_specs=[spec((3,)), spec((1,), types.int32)], opset_version=ct.target.iOS17)
    def prog(x, i):
        never_written = mb.make_list(init_length=2, elem_shape=["s"], dtype="fp32")
        return mb.list_read(ls=never_written, index=mb.squeeze(x=i), name="bad_read")

    with pytest.raises(BuildError, match="bad_read"):
        run_program(prog, {"x": np.zeros(3, np.float32), "i": np.array([0], np.int32)})


def test_values_are_dropped_after_their_last_reader():
    import weakref

    @mb.program(input_specs=[spec((2, 3))])
    def prog(x):
        a = mb.relu(x=x, name="a")
        b = mb.sigmoid(x=a, name="b")
        c = mb.tanh(x=b, name="c")
        return mb.add(x=c, y=b, name="d")  # b stays alive until d reads it

    alive, seen = {}, {}

    def observe(op, outputs):
        seen[op.name] = {name: ref() is not None for name, ref in alive.items()}
        alive[op.name] = weakref.ref(outputs[0])

    x = RNG.standard_normal((2, 3)).astype(np.float32)
    (out,) = run_program(prog, {"x": x}).values()
    np.testing.assert_allclose(out, np.tanh(1 / (1 + np.exp(-np.maximum(x, 0)))) + 1 / (1 + np.exp(-np.maximum(x, 0))),
                               rtol=1e-6)
    run_program(prog, {"x": x}, observer=observe)
    assert seen["c"] == {"a": False, "b": True}  # a's last reader (b) has run; b is read again by d
    assert seen["d"] == {"a": False, "b": True, "c": True}


def _three_dequantized_matmuls():
    weights = [RNG.integers(-128, 128, size=(32, 32)).astype(np.int8) for _ in range(3)]  # 4 KB dense

    @mb.program(input_specs=[spec((2, 32))], opset_version=ct.target.iOS16)
    def prog(x):
        dense = [mb.constexpr_affine_dequantize(quantized_data=w, zero_point=np.int8(0), scale=np.float32(0.5),
                                                axis=0) for w in weights]
        for d in dense:
            x = mb.matmul(x=x, y=d)
        return x

    x = RNG.standard_normal((2, 32)).astype(np.float32)
    expected = x
    for w in weights:
        expected = expected @ (w.astype(np.float32) * 0.5)
    return prog, x, expected


def _tracking_expansions(patch) -> list:
    """Weak references to every array the dequantize evaluator makes, in order."""
    import weakref

    prog, x, _ = _three_dequantized_matmuls()
    run_program(prog, {"x": x})  # loads the evaluators
    made: list = []
    expand = EVALUATORS["constexpr_affine_dequantize"]

    def tracking(op, x):
        result = expand(op, x)
        made.append((weakref.ref(result), sum(ref() is not None for ref, _ in made)))
        return result

    patch.setattr(EVALUATORS.entry("constexpr_affine_dequantize"), "obj", tracking)
    return made


def test_compressed_weights_are_expanded_only_while_read_when_not_cached():
    """Decompression ops stand at the top of a program: all expanded up front, every weight of
    the model would be dense at once."""
    from edgebuild_coreml.interpreter import plan

    prog, x, expected = _three_dequantized_matmuls()
    with pytest.MonkeyPatch.context() as patch:
        made = _tracking_expansions(patch)
        patch.setattr(plan, "EXPANDED_CACHE_BYTES", 0)
        for _ in range(2):
            (got,) = run_program(prog, {"x": x}).values()
            np.testing.assert_allclose(got, expected, rtol=1e-5)
    live_at_expansion = [live for _, live in made]
    assert live_at_expansion == [0] * 6  # each dropped before the next is made, on every run
    assert all(ref() is None for ref, _ in made)


def test_expanded_weights_are_cached_across_runs_up_to_the_cap():
    from edgebuild_coreml.interpreter import plan

    prog, x, expected = _three_dequantized_matmuls()
    with pytest.MonkeyPatch.context() as patch:
        made = _tracking_expansions(patch)
        patch.setattr(plan, "EXPANDED_CACHE_BYTES", 32 * 32 * 4)  # room for one float32 [32, 32] weight
        for _ in range(3):
            (got,) = run_program(prog, {"x": x}).values()
            np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert len(made) == 3 + 2 + 2  # the first weight is expanded once, the other two on every run
    assert sum(ref() is not None for ref, _ in made) == 1
    plan.forget_plans(prog)
    assert all(ref() is None for ref, _ in made)


def test_in_place_ops_never_overwrite_a_value_read_later():
    """Elementwise ops write into an input only when nothing else can see it: not a function
    input or output, not a value a later op reads, not the base of a live view."""
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)

    @mb.program(input_specs=[spec((2, 3, 4))], opset_version=ct.target.iOS17)
    def prog(x):
        first = mb.relu(x=x)  # x is the caller's array
        shifted = mb.add(x=first, y=np.float32(1.0))  # an output, read again below
        view = mb.reshape(x=shifted, shape=[6, 4])  # shares shifted's memory
        scaled = mb.mul(x=shifted, y=np.float32(2.0))  # shifted dead here, but view is alive
        clipped = mb.clip(x=scaled, alpha=np.float32(0.5), beta=np.float32(2.5))  # scaled dead: free
        squashed = mb.sigmoid_hard(x=clipped, alpha=np.float32(0.3), beta=np.float32(0.1))
        flat = mb.reshape(x=squashed, shape=[6, 4])
        return shifted, mb.sub(x=view, y=flat), mb.silu(x=mb.exp(x=flat))

    kept = x.copy()
    shifted, difference, silu = run_program(prog, {"x": x}).values()
    np.testing.assert_array_equal(x, kept)
    want_shifted = np.maximum(kept, 0) + 1
    want_squashed = np.clip(0.3 * np.clip(2 * want_shifted, 0.5, 2.5) + 0.1, 0, 1).reshape(6, 4)
    np.testing.assert_allclose(shifted, want_shifted, rtol=1e-6)
    np.testing.assert_allclose(difference, want_shifted.reshape(6, 4) - want_squashed, rtol=1e-6, atol=1e-6)
    e = np.exp(want_squashed)
    np.testing.assert_allclose(silu, e / (1 + np.exp(-e)), rtol=1e-6)


def test_in_place_ops_write_into_dead_intermediates():
    from edgebuild_coreml.interpreter.registry import INPLACE

    x = RNG.standard_normal((64,)).astype(np.float32)

    @mb.program(input_specs=[spec((64,))], opset_version=ct.target.iOS17)
    def prog(x):
        a = mb.mul(x=x, y=np.float32(3.0))
        b = mb.add(x=a, y=np.float32(1.0))
        return mb.relu(x=b)

    made = []
    with pytest.MonkeyPatch.context() as patch:
        run_program(prog, {"x": x})  # loads the evaluators
        for op_type in ("mul", "add", "relu"):
            assert op_type in INPLACE
            original = EVALUATORS[op_type]

            def tracking(op, args, donated=(), original=original):
                result = original(op, args, donated=donated)
                made.append(result.__array_interface__["data"][0])
                return result

            patch.setattr(EVALUATORS.entry(op_type), "obj", tracking)
        (got,) = run_program(prog, {"x": x}).values()
    np.testing.assert_allclose(got, np.maximum(3 * x + 1, 0), rtol=1e-6)
    assert len(set(made)) == 1  # mul made the buffer; add and relu wrote into it


def test_interpreter_runtime_reads_a_package_once_until_it_changes(tmp_path, monkeypatch):
    from edgebuild_coreml import interpreter
    from edgebuild_coreml.runtime import InterpreterRuntime

    def program(scale):
        @mb.program(input_specs=[spec((2, 3))], opset_version=ct.target.iOS17)
        def prog(x):
            return mb.mul(x=x, y=np.float32(scale))

        return prog

    path = saved(program(2.0), tmp_path / "m.mlpackage")
    loads = []
    load = interpreter.load_mlpackage
    monkeypatch.setattr(interpreter, "load_mlpackage", lambda p: loads.append(p) or load(p))
    runtime, x = InterpreterRuntime(), RNG.standard_normal((2, 3)).astype(np.float32)
    for _ in range(3):
        (got,) = runtime.run(path, {"x": x}).values()
        np.testing.assert_allclose(got, 2 * x, rtol=1e-6)
    assert len(loads) == 1
    import shutil
    import time

    shutil.rmtree(path)
    time.sleep(0.01)  # a distinct modification time even on coarse clocks
    saved(program(3.0), path)
    (got,) = runtime.run(path, {"x": x}).values()
    np.testing.assert_allclose(got, 3 * x, rtol=1e-6)
    assert len(loads) == 2
