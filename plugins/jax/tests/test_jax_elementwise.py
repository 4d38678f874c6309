import numpy as np
import pytest

from jax_checks import assert_converts, jax, jnp

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 4)).astype(np.float32)
Y = RNG.standard_normal((2, 3, 4)).astype(np.float32)


@pytest.mark.parametrize("fn", [jnp.abs, jnp.exp, jnp.tanh, jnp.sin, jnp.cos, jnp.floor, jnp.ceil, jnp.sign,
                                jax.nn.sigmoid, jnp.negative, jnp.round, jnp.expm1, jnp.log1p],
                         ids=lambda f: f.__name__)
def test_unary_float_ops_match_jax(fn):
    assert_converts(fn, X, rtol=1e-5, atol=1e-6, lowered_tol=(1e-3, 1e-4))


@pytest.mark.parametrize("fn", [jnp.add, jnp.subtract, jnp.multiply, jnp.maximum, jnp.minimum, jnp.divide,
                                jnp.fmod, jnp.arctan2], ids=lambda f: f.__name__)
def test_binary_float_ops_match_jax(fn):
    assert_converts(fn, X, Y, lowered_tol=(1e-3, 1e-4))


def test_positive_only_ops_match_jax():
    positive = np.abs(X) + 0.1
    for fn in (jnp.sqrt, jax.lax.rsqrt, jnp.log, jnp.cbrt):
        assert_converts(fn, positive, lowered_tol=(1e-3, 1e-4))


@pytest.mark.parametrize("direction", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_comparisons_and_select_match_jax(direction):
    compare = getattr(jax.lax, direction)
    assert_converts(lambda a, b: (compare(a, b), jnp.where(compare(a, b), a, b)), X, np.round(Y))


def test_clamp_with_scalar_and_tensor_bounds():
    assert_converts(lambda x: jax.lax.clamp(-0.5, x, 0.5), X)
    assert_converts(lambda lo, x: jax.lax.clamp(lo, x, lo + 1.0), Y, X)


@pytest.mark.parametrize("dtype", [np.int32, np.float16, np.bool_])
def test_convert_from_float(dtype):
    assert_converts(lambda x: (x * 3).astype(dtype), X)


def test_integer_and_boolean_arithmetic():
    a = RNG.integers(-20, 20, (3, 4)).astype(np.int32)
    b = RNG.integers(1, 7, (3, 4)).astype(np.int32)
    assert_converts(lambda a, b: (a + b, a * b, a // b, jax.lax.div(a, b), jax.lax.rem(a, b), jnp.maximum(a, b)),
                    a, b, lowered=False)
    assert_converts(lambda a, b: (a & b, a | b, a ^ b, ~a), a, b, lowered=False)
    p, q = a > 0, b > 3
    assert_converts(lambda p, q: (p & q, p | q, p ^ q, ~p), p, q)


def test_reduce_precision_to_half_and_bfloat():
    assert_converts(lambda x: jax.lax.reduce_precision(x * 1000, exponent_bits=5, mantissa_bits=10), X,
                    lowered=False)
    assert_converts(lambda x: jax.lax.reduce_precision(x * 1000, exponent_bits=8, mantissa_bits=7), X,
                    lowered=False)


def test_unsupported_op_names_itself_and_the_python_line():
    from jax_checks import export, to_onnx

    from edgebuild.plugin import BuildError

    exported = export(lambda x: jax.lax.population_count(x), np.zeros(3, np.int32))
    with pytest.raises(BuildError, match=r"stablehlo.popcnt at .*test_jax_elementwise.py:\d+"):
        to_onnx(exported)
