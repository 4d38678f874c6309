"""The while loops the StableHLO frontend turns into ONNX Loops, run through the Core ML lowering
too: carries that all start as constants with a condition computed from them (no trip count),
carries of every dtype Core ML holds, tuples and arrays, and counted loops whose counter starts
from a function argument (``fori_loop`` with traced bounds)."""

import numpy as np
import pytest

from jax_checks import assert_converts, jax, jnp

lax = jax.lax
X = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
LOOSE = (1e-3, 1e-3)


def _loops(model):
    return [n for n in model.graph.node if n.op_type == "Loop"]


def test_every_carry_a_constant_and_no_trip_count():
    # the loop reads no argument: its carries and its first condition are constants
    fn = lambda x: (lax.while_loop(lambda c: c[0] < 10.0, lambda c: (c[0] * 1.5 + 1, c[1] + 1), (1.0, 0)), x)
    model = assert_converts(fn, X, lowered_tol=LOOSE)
    (loop,) = _loops(model)
    assert loop.input[0] == ""  # not a counted loop: the condition alone ends it


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.int32])
@pytest.mark.parametrize("shape", [(), (2, 3)])
def test_constant_carries_of_each_dtype(dtype, shape):
    def fn(x):
        start = jnp.ones(shape, dtype)
        done = lax.while_loop(lambda c: jnp.max(c[0]).astype(jnp.float32) < 50.0,
                              lambda c: (c[0] * 2 + 1, c[1] + 1, jnp.logical_not(c[2])),
                              (start, jnp.int32(0), jnp.bool_(True)))
        return done, x + 1
    assert_converts(fn, X, lowered_tol=(2e-3, 2e-3))


@pytest.mark.parametrize("limit", [1.0, 10.0, 1000.0])
def test_constant_carries_beside_an_argument(limit):
    # one carry from the argument, two constants; the condition reads a constant carry only
    def fn(x):
        return lax.while_loop(lambda c: c[1] < limit, lambda c: (c[0] * 0.5 + c[1], c[1] * 1.5 + 1.0, c[2] + 2),
                              (x, jnp.float32(1.0), jnp.int32(3)))
    assert_converts(fn, X, lowered_tol=LOOSE)


def test_first_condition_a_constant_next_ones_not():
    fn = lambda x: lax.while_loop(lambda c: c[1] < 10.0, lambda c: (c[0] * 1.5, c[1] * 2.0), (x, jnp.float32(1.0)))
    assert_converts(fn, X, lowered_tol=LOOSE)


def test_array_carries_with_a_condition_on_their_sum():
    def fn(x):
        return lax.while_loop(lambda c: jnp.sum(c[0]) < 100.0,
                              lambda c: (c[0] + c[1], c[1] * 2.0, c[2] + 1),
                              (jnp.zeros((2, 2), jnp.float32), jnp.arange(4, dtype=jnp.float32).reshape(2, 2) + 1,
                               jnp.int32(0)))[0] + x[:2, :2]
    assert_converts(fn, X, lowered_tol=LOOSE)


@pytest.mark.parametrize("traced", ["lower", "both"])
@pytest.mark.parametrize("start", [-2, 0, 1, 4, 6])
def test_fori_loop_whose_counter_starts_from_an_argument(traced, start):
    body = lambda i, a: a * 0.5 + i.astype(a.dtype)
    if traced == "lower":
        assert_converts(lambda x, n: lax.fori_loop(n, 4, body, x), X, np.int32(start), lowered_tol=LOOSE)
    else:
        assert_converts(lambda x, n, m: lax.fori_loop(n, m, body, x), X, np.int32(start), np.int32(5),
                        lowered_tol=LOOSE)


@pytest.mark.parametrize("start", [-1, 2, 7])
def test_fori_loop_from_an_argument_with_an_integer_carry(start):
    fn = lambda n, k: lax.fori_loop(n, 6, lambda i, c: (c[0] + i, c[1] * 2), (k, jnp.int32(1)))
    assert_converts(fn, np.int32(start), np.int32(10))


def test_nested_loops_whose_inner_carries_start_as_constants():
    def fn(x):
        def outer(c):
            inner = lax.while_loop(lambda d: d[0] < c[0] * 2, lambda d: (d[0] * 1.5 + 1, d[1] + 1), (1.0, 0))
            return inner[0], c[1] + inner[1]
        return lax.while_loop(lambda c: c[0] < 100.0, outer, (2.0, 0)), x
    assert_converts(fn, X, lowered_tol=LOOSE)


def test_constant_loop_inside_a_branch():
    def fn(x, p):
        looped = lambda: lax.while_loop(lambda c: c[0] < 10.0, lambda c: (c[0] * 1.5 + 1, c[1] + 1), (1.0, 0))[0]
        return lax.cond(p > 0, looped, lambda: 0.0) + x
    for p in (-1, 1):
        assert_converts(fn, X, np.int32(p), lowered_tol=LOOSE)


def test_bool_tensor_carry_from_a_constant():
    fn = lambda x: lax.while_loop(lambda c: c[1] < 5, lambda c: (jnp.logical_not(c[0]), c[1] + 1),
                                  (jnp.array([True, False]), 0)) + (x,)
    assert_converts(fn, X)


def test_scan_over_nothing_from_a_constant_carry():
    fn = lambda x: lax.scan(lambda c, _: (c * 2 + 1, c), 1.0, None, length=5) + (x,)
    assert_converts(fn, X, lowered_tol=LOOSE)


def test_fori_loop_with_both_bounds_from_one_argument_and_a_tuple_carry():
    fn = lambda x, n: lax.fori_loop(n, 2 * n + 3, lambda i, c: (c[0] + i, c[1] * 1.01), (0, x))
    for n in (-3, 0, 2):
        assert_converts(fn, X, np.int32(n), lowered_tol=LOOSE)
