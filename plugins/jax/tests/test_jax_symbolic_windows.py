"""Sorts and windowed reductions over symbolic dims: sort (ascending, descending, several
operands, argsort) and top_k along a symbolic dim. Each model is exported once, converted once,
and must match JAX at two concrete sizes (and in the Core ML lowering at the first)."""

from __future__ import annotations

import numpy as np
import pytest

from jax_checks import assert_converts_dynamic, jax, jnp
from test_jax_symbolic_converters import specs

lax = jax.lax
RNG = np.random.default_rng(17)
TOL = dict(rtol=1e-4, atol=1e-4)


def distinct(*shape):
    """Floats without ties, so every order is unique (ties are tested on their own)."""
    return RNG.permutation(int(np.prod(shape))).reshape(shape).astype(np.float32) * 0.25 - 3.0


# -- sort and top_k along a symbolic dim ----------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("descending", [False, True])
def test_a_sort_along_a_symbolic_dim(axis, descending):
    def fn(x):
        return jnp.sort(x, axis=axis, descending=descending)

    assert_converts_dynamic(fn, specs("b, s"), [[distinct(3, 4)], [distinct(5, 7)]], **TOL)


@pytest.mark.parametrize("descending", [False, True])
def test_an_argsort_along_a_symbolic_dim(descending):
    def fn(x):
        return jnp.argsort(x, axis=-1, descending=descending)

    assert_converts_dynamic(fn, specs("b, s"), [[distinct(2, 5)], [distinct(3, 9)]])


def test_a_stable_sort_with_ties_keeps_equal_keys_in_order():
    def fn(keys, values):
        return lax.sort((keys, values), dimension=1, num_keys=1, is_stable=True)

    def case(b, s):
        return [RNG.integers(0, 3, (b, s)).astype(np.float32), distinct(b, s)]

    assert_converts_dynamic(fn, specs("b, s", "b, s"), [case(2, 6), case(4, 11)], **TOL)


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_a_multi_operand_sort_over_a_symbolic_dim(dtype):
    def fn(keys, a, b):
        return lax.sort((keys, a, b), dimension=0, num_keys=1)

    def case(n):
        return [distinct(n, 2), distinct(n, 2), RNG.integers(-5, 5, (n, 2)).astype(dtype)]

    assert_converts_dynamic(fn, specs("n, 2", "n, 2", "n, 2", dtypes=[np.float32, np.float32, dtype]),
                            [case(3), case(8)], **TOL)


@pytest.mark.parametrize("k", [1, 3])
def test_top_k_over_a_symbolic_last_dim(k):
    def fn(x):
        return lax.top_k(x, k)

    assert_converts_dynamic(fn, specs("b, s", constraints=("s >= 3",)), [[distinct(2, 4)], [distinct(3, 10)]],
                            **TOL)
