"""Control flow in the MIL interpreter: cond, while_loop (also carrying a list), and state
read and update.
"""

from __future__ import annotations

import numpy as np
import pytest

ct = pytest.importorskip("coremltools")
from coremltools.converters.mil import Builder as mb  # noqa: E402
from coremltools.converters.mil.mil import types  # noqa: E402
from interpreter_programs import roundtrip, saved, spec  # noqa: E402

from edgebuild_coreml.interpreter import run_mlpackage, run_program  # noqa: E402

RNG = np.random.default_rng(0)


def test_list_ops_inside_a_loop():
    @mb.program(input_specs=[spec((3, 2))], opset_version=ct.target.iOS17)
    def prog(x):
        ls = mb.make_list(init_length=3, elem_shape=[2], dtype="fp32", dynamic_length=True)

        def cond(i, ls):
            return mb.less(x=i, y=3)

        def body(i, ls):
            row = mb.gather(x=x, indices=i, axis=0)
            return mb.add(x=i, y=1), mb.list_write(ls=ls, index=i, value=mb.mul(x=row, y=10.0))

        _, ls = mb.while_loop(_cond=cond, _body=body, loop_vars=(0, ls))
        return (
            mb.list_gather(ls=ls, indices=[2, 0], name="gathered"),
            mb.list_read(ls=ls, index=1, name="read"),
            mb.list_length(ls=ls, name="length"),
        )

    x = RNG.standard_normal((3, 2)).astype(np.float32)
    o = run_program(prog, {"x": x})
    np.testing.assert_allclose(o["gathered"], 10 * x[[2, 0]], rtol=1e-6)
    np.testing.assert_allclose(o["read"], 10 * x[1], rtol=1e-6)
    assert int(o["length"]) == 3


def test_cond_takes_each_branch(tmp_path):
    @mb.program(input_specs=[spec((3,))], opset_version=ct.target.iOS17)
    def prog(x):
        positive = mb.greater(x=mb.reduce_sum(x=x), y=0.0)
        return mb.cond(
            pred=positive,
            _true_fn=lambda: mb.mul(x=x, y=2.0),
            _false_fn=lambda: mb.sub(x=x, y=100.0),
            name="chosen",
        )

    path = saved(prog, tmp_path / "cond.mlpackage")
    up = np.array([1.0, 2.0, -0.5], np.float32)
    down = -up
    (out_up,) = run_mlpackage(path, {"x": up}).values()
    (out_down,) = run_mlpackage(path, {"x": down}).values()
    np.testing.assert_array_equal(out_up, up * 2)
    np.testing.assert_array_equal(out_down, down - 100)


def test_while_loop_runs_until_condition_fails(tmp_path):
    @mb.program(input_specs=[spec((4,)), spec((1,), types.int32)], opset_version=ct.target.iOS17)
    def prog(x, n):
        limit = mb.squeeze(x=n)

        def cond(i, acc):
            return mb.less(x=i, y=limit)

        def body(i, acc):
            return mb.add(x=i, y=1), mb.add(x=mb.mul(x=acc, y=2.0), y=1.0)

        i, acc = mb.while_loop(_cond=cond, _body=body, loop_vars=(0, x))
        return mb.identity(x=acc, name="acc"), mb.identity(x=i, name="count")

    x = np.array([0, 1, 2, 3], np.float32)
    o = roundtrip(prog, tmp_path, {"x": x, "n": np.array([5], np.int32)})
    expected = x.copy()
    for _ in range(5):
        expected = expected * 2 + 1
    np.testing.assert_array_equal(o["acc"], expected)
    assert int(o["count"]) == 5


def test_state_read_and_update_ios18():
    @mb.program(
        input_specs=[mb.StateTensorSpec((1, 4), dtype=types.fp16), spec((1, 4), types.fp16)],
        opset_version=ct.target.iOS18,
    )
    def prog(cache, x):
        mb.coreml_update_state(state=cache, value=mb.add(x=mb.read_state(input=cache), y=x))
        return mb.mul(x=mb.read_state(input=cache), y=np.float16(2), name="out")

    cache = np.ones((1, 4), np.float16)
    x = np.arange(4, dtype=np.float16).reshape(1, 4)
    np.testing.assert_array_equal(run_program(prog, {"cache": cache, "x": x})["out"], 2 * (cache + x))
