"""Elementwise evaluators of the MIL interpreter: binary arithmetic, comparison and logic, unary
math, round/clip/threshold and cast, against numpy.

Programs are built with coremltools' Builder, saved as .mlpackage, read back and interpreted.
"""

from __future__ import annotations

import numpy as np
import pytest

ct = pytest.importorskip("coremltools")
from coremltools.converters.mil import Builder as mb  # noqa: E402
from coremltools.converters.mil.mil import types  # noqa: E402
from interpreter_programs import roundtrip, spec  # noqa: E402

RNG = np.random.default_rng(0)


BINARY_REFERENCE = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "real_div": np.divide,
    "floor_div": lambda a, b: np.floor(a / b),
    "mod": lambda a, b: a - np.floor(a / b) * b,
    "pow": lambda a, b: np.abs(a) ** b,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "equal": np.equal,
    "not_equal": np.not_equal,
    "less": np.less,
    "less_equal": np.less_equal,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
}
A = np.round(RNG.uniform(-3, 3, (3, 4)), 1).astype(np.float32)
B = np.round(RNG.uniform(0.5, 2, (1, 4)), 1).astype(np.float32)
A[0, :2] = B[0, :2]  # some equal pairs for the comparisons


@pytest.fixture(scope="module")
def binary_outputs(tmp_path_factory):
    @mb.program(input_specs=[spec((3, 4)), spec((1, 4))], opset_version=ct.target.iOS17)
    def prog(a, b):
        outs = []
        for name in BINARY_REFERENCE:
            lhs = mb.abs(x=a) if name == "pow" else a
            outs.append(mb.identity(x=getattr(mb, name)(x=lhs, y=b), name=f"out_{name}"))
        return tuple(outs)

    return roundtrip(prog, tmp_path_factory.mktemp("bin"), {"a": A, "b": B})


@pytest.mark.parametrize("name", list(BINARY_REFERENCE))
def test_binary_op_matches_numpy(binary_outputs, name):
    expected = BINARY_REFERENCE[name](A.astype(np.float64), B.astype(np.float64))
    got = binary_outputs[f"out_{name}"]
    assert got.shape == (3, 4)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_logical_and_int_binary_ops(tmp_path):
    p = RNG.integers(0, 2, (2, 5)).astype(bool)
    q = RNG.integers(0, 2, (2, 5)).astype(bool)
    i = np.array([[7, -7, 8, -8, 0]] * 2, np.int32)
    j = np.array([[2, 2, -3, -3, 5]] * 2, np.int32)

    @mb.program(
        input_specs=[spec((2, 5), types.bool), spec((2, 5), types.bool),
                     spec((2, 5), types.int32), spec((2, 5), types.int32)],
        opset_version=ct.target.iOS17,
    )
    def prog(p, q, i, j):
        return (
            mb.logical_and(x=p, y=q, name="and_"), mb.logical_or(x=p, y=q, name="or_"),
            mb.logical_xor(x=p, y=q, name="xor_"), mb.logical_not(x=p, name="not_"),
            mb.floor_div(x=i, y=j, name="fdiv"), mb.mod(x=i, y=j, name="mod_"),
        )

    out = roundtrip(prog, tmp_path, {"p": p, "q": q, "i": i, "j": j})
    np.testing.assert_array_equal(out["and_"], p & q)
    np.testing.assert_array_equal(out["or_"], p | q)
    np.testing.assert_array_equal(out["xor_"], p ^ q)
    np.testing.assert_array_equal(out["not_"], ~p)
    # Python semantics: floor division, remainder takes the divisor's sign.
    np.testing.assert_array_equal(out["fdiv"][0], [7 // 2, -7 // 2, 8 // -3, -8 // -3, 0])
    np.testing.assert_array_equal(out["mod_"][0], [7 % 2, -7 % 2, 8 % -3, -8 % -3, 0])
    assert out["fdiv"].dtype == np.int32


UNARY_REFERENCE = {
    "abs": (np.abs, (-3, 3)),
    "acos": (np.arccos, (-0.9, 0.9)),
    "asin": (np.arcsin, (-0.9, 0.9)),
    "atan": (np.arctan, (-3, 3)),
    "atanh": (np.arctanh, (-0.9, 0.9)),
    "ceil": (np.ceil, (-3, 3)),
    "cos": (np.cos, (-3, 3)),
    "cosh": (np.cosh, (-3, 3)),
    "erf": (None, (-2, 2)),
    "exp": (np.exp, (-3, 3)),
    "exp2": (np.exp2, (-3, 3)),
    "floor": (np.floor, (-3, 3)),
    "sign": (np.sign, (-3, 3)),
    "sin": (np.sin, (-3, 3)),
    "sinh": (np.sinh, (-3, 3)),
    "sqrt": (np.sqrt, (0.1, 4)),
    "square": (np.square, (-3, 3)),
    "tan": (np.tan, (-1.2, 1.2)),
    "tanh": (np.tanh, (-3, 3)),
    "inverse": (lambda v: 1.0 / (v + 1e-4), (0.5, 3)),
    "log": (lambda v: np.log(v + 1e-45), (0.1, 4)),
    "rsqrt": (lambda v: 1.0 / np.sqrt(v + 1e-12), (0.1, 4)),
}


def _erf_reference(v):
    import math

    return np.array([math.erf(float(t)) for t in v.ravel()]).reshape(v.shape)


@pytest.fixture(scope="module")
def unary_case(tmp_path_factory):
    samples = {n: RNG.uniform(lo, hi, (2, 6)).astype(np.float32) for n, (_, (lo, hi)) in UNARY_REFERENCE.items()}
    names = list(UNARY_REFERENCE)

    @mb.program(input_specs=[spec((len(names), 2, 6))], opset_version=ct.target.iOS17)
    def prog(xs):
        rows = [mb.gather(x=xs, indices=k, axis=0) for k in range(len(names))]
        return tuple(mb.identity(x=getattr(mb, n)(x=v), name=f"out_{n}") for n, v in zip(names, rows))

    inputs = {"xs": np.stack([samples[n] for n in names])}
    return samples, roundtrip(prog, tmp_path_factory.mktemp("un"), inputs)


@pytest.mark.parametrize("name", list(UNARY_REFERENCE))
def test_unary_op_matches_numpy(unary_case, name):
    samples, outputs = unary_case
    fn = UNARY_REFERENCE[name][0] or _erf_reference
    np.testing.assert_allclose(outputs[f"out_{name}"], fn(samples[name].astype(np.float64)), rtol=2e-6, atol=2e-6)


def test_round_clip_threshold_cast(tmp_path):
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.7, -2.7], np.float32)

    @mb.program(input_specs=[spec((8,))], opset_version=ct.target.iOS17)
    def prog(x):
        return (
            mb.round(x=x, name="rounded"),
            mb.clip(x=x, alpha=-1.0, beta=2.0, name="clipped"),
            mb.threshold(x=x, alpha=0.5, name="thresholded"),
            mb.cast(x=x, dtype="int32", name="as_int"),
            mb.cast(x=x, dtype="bool", name="as_bool"),
        )

    out = roundtrip(prog, tmp_path, {"x": x})
    np.testing.assert_array_equal(out["rounded"], [-2, -2, -0, 0, 2, 2, 3, -3])  # half to even
    np.testing.assert_array_equal(out["clipped"], np.minimum(np.maximum(x, -1), 2))
    np.testing.assert_array_equal(out["thresholded"], np.where(x < 0.5, 0.5, x))
    np.testing.assert_array_equal(out["as_int"], [-2, -1, 0, 0, 1, 2, 2, -2])
    assert out["as_int"].dtype == np.int32
    np.testing.assert_array_equal(out["as_bool"], x != 0)
