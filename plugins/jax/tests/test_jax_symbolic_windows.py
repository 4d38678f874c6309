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


# -- dynamic_reduce_window: pooling over symbolic spatial dims -------------------------------

def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


WINDOWS = [((2, 2), (2, 2), "SAME"), ((3, 3), (1, 1), "SAME"), ((3, 2), (2, 1), "VALID"),
           ((2, 3), (1, 2), ((1, 0), (2, 1)))]


@pytest.mark.parametrize("reducer", ["max", "min", "sum"])
@pytest.mark.parametrize("window,strides,padding", WINDOWS, ids=["same_strided", "same", "valid", "explicit"])
def test_a_window_reduced_over_symbolic_height_and_width(reducer, window, strides, padding):
    computation, init = {"max": (lax.max, -jnp.inf), "min": (lax.min, jnp.inf), "sum": (lax.add, 0.0)}[reducer]

    full = padding if isinstance(padding, str) else ((0, 0),) + padding + ((0, 0),)

    def fn(x):
        return lax.reduce_window(x, init, computation, (1,) + window + (1,), (1,) + strides + (1,), full)

    assert_converts_dynamic(fn, specs("b, h, w, 3"), [[rand(1, 5, 6, 3)], [rand(2, 8, 7, 3)]], **TOL)


@pytest.mark.parametrize("layout", ["nhwc", "nchw", "1d"])
def test_max_pooling_over_symbolic_dims_in_each_layout(layout):
    import flax.linen as nn

    if layout == "nhwc":
        fn, template, shapes = (lambda x: nn.max_pool(x, (2, 2), strides=(2, 2), padding="SAME"),
                                "b, h, w, 2", [(1, 5, 4, 2), (2, 7, 9, 2)])
    elif layout == "nchw":
        fn, template, shapes = (lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 3, 3), (1, 1, 2, 2),
                                                            "SAME"), "b, 2, h, w", [(1, 2, 5, 4), (2, 2, 7, 9)])
    else:
        fn, template, shapes = (lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (3,), (2,), "SAME"),
                                "s", [(5,), (12,)])
    assert_converts_dynamic(fn, specs(template), [[rand(*s)] for s in shapes], **TOL)


def test_a_window_along_a_static_dim_of_a_symbolic_batch():
    def fn(x):
        return lax.reduce_window(x, -jnp.inf, lax.max, (1, 3), (1, 1), "SAME")

    assert_converts_dynamic(fn, specs("b, 6"), [[rand(2, 6)], [rand(5, 6)]], **TOL)


# -- dynamic_reduce_window: cumulative reductions over a symbolic length ----------------------

CUMULATIVE = {"cumsum": jnp.cumsum, "cumprod": jnp.cumprod, "cummax": lax.cummax, "cummin": lax.cummin}


@pytest.mark.parametrize("name", sorted(CUMULATIVE))
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("reverse", [False, True])
def test_a_cumulative_reduction_over_a_symbolic_length(name, axis, reverse):
    op = CUMULATIVE[name]

    def fn(x):
        if name.startswith("cummax") or name.startswith("cummin"):
            return op(x, axis=axis, reverse=reverse)
        return jnp.flip(op(jnp.flip(x, axis), axis=axis), axis) if reverse else op(x, axis=axis)

    def case(b, s):
        x = rand(b, s)
        return [np.clip(x, -1.2, 1.2) if name == "cumprod" else x]

    assert_converts_dynamic(fn, specs("b, s"), [case(3, 4), case(5, 9)], **TOL)


def test_lax_cumsum_in_reverse_over_a_symbolic_length():
    def fn(x):
        return lax.cumsum(x, axis=1, reverse=True)

    assert_converts_dynamic(fn, specs("b, s"), [[rand(2, 5)], [rand(3, 8)]], **TOL)


@pytest.mark.parametrize("name", sorted(CUMULATIVE))
@pytest.mark.parametrize("dtype", [np.int32, np.float16])
def test_a_cumulative_reduction_of_other_dtypes_over_a_symbolic_length(name, dtype):
    op = CUMULATIVE[name]

    def fn(x):
        return op(x, axis=1)

    def case(b, s):
        return [RNG.integers(-2, 3, (b, s)).astype(dtype)]

    assert_converts_dynamic(fn, specs("b, s", dtypes=[dtype]), [case(2, 4), case(3, 7)], rtol=1e-2, atol=1e-2)


def test_a_run_time_window_that_is_not_cumulative_is_refused_naming_the_op():
    from edgebuild.errors import BuildError
    from jax import export as jax_export

    from jax_checks import to_onnx

    def fn(x):  # a window half as long as the dim: no cumulative reduction
        return lax.reduce_window(x, 0.0, lax.add, (1, x.shape[1] // 2), (1, 1), "VALID")

    exported = jax_export.export(jax.jit(fn))(*specs("b, s", constraints=("s >= 2",)))
    with pytest.raises(BuildError, match="custom_call.*only as a cumulative reduction"):
        to_onnx(exported)
