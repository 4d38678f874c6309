import re

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


# -- select on every element type -------------------------------------------------------------

LOWERED_SELECT = (np.int8, np.int16, np.int32, np.uint8, np.uint16, np.bool_, np.float16, np.float32)
SELECT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.bool_,
                 np.float16, np.float32]


@pytest.mark.parametrize("dtype", SELECT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_where_on_each_element_type(dtype):
    a = RNG.integers(0, 100, (3, 4)).astype(dtype)
    b = RNG.integers(0, 100, (3, 4)).astype(dtype)
    pick = RNG.random((3, 4)) > 0.5
    with jax.enable_x64(np.dtype(dtype).itemsize == 8):  # 64-bit ints need x64, else jax narrows them
        assert_converts(lambda p, a, b: jnp.where(p, a, b), pick, a, b, lowered=dtype in LOWERED_SELECT)


@pytest.mark.parametrize("dtype", [np.int16, np.int8, np.uint16], ids=lambda d: np.dtype(d).name)
def test_dynamic_slice_with_narrow_indices(dtype):
    x = np.arange(40, dtype=np.float32).reshape(5, 8)
    for start in (0, 2, 7):  # 7 runs past the end and is clamped
        # the Core ML lowering widens int8/int16 inputs but not constants, so its Less sees mixed types
        assert_converts(lambda x, i: jax.lax.dynamic_slice(x, (i, i), (2, 3)), x, np.asarray(start, dtype),
                        lowered=dtype == np.uint16)


# -- bf16 -------------------------------------------------------------------------------------------


def assert_converts_bf16(fn, *args, rtol=1e-2, atol=1e-2):
    """As assert_converts for modules computing in bf16, which the graph carries as float32
    (``convert.types.CARRIED``): bf16 inputs are fed, and bf16 results compared, as float32, on
    onnxruntime and on the Core ML lowering (test_jax_bfloat16.py holds the rounding exact)."""
    from jax_checks import export, run_lowered, run_onnxruntime, to_onnx

    arrays = [np.asarray(a) for a in args]
    exported = export(fn, *arrays)
    want = [np.asarray(w) for w in jax.tree_util.tree_leaves(exported.call(*arrays))]
    model = to_onnx(exported)
    fed = [a.astype(np.float32) if a.dtype == jnp.bfloat16 else a for a in arrays]
    for what, got in (("onnxruntime", run_onnxruntime(model, fed)), ("lowered", run_lowered(model, fed))):
        assert len(got) == len(want), what
        for g, w in zip(got, want):
            assert g.dtype == (np.float32 if w.dtype == jnp.bfloat16 else w.dtype) and g.shape == w.shape, what
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol, err_msg=what)


def test_bfloat16_arithmetic_with_constants():
    def fn(x):
        b = x.astype(jnp.bfloat16)
        scale = jnp.asarray([1.5, -2.25, 3.0, 0.125], jnp.bfloat16)  # a non-splat bf16 constant
        return (b * scale + jnp.bfloat16(2.0)).astype(jnp.float32), jnp.maximum(b, jnp.bfloat16(0))
    assert_converts_bf16(fn, X)


def test_bfloat16_special_and_large_constants():
    big = np.linspace(-3, 3, 4096).astype(jnp.bfloat16).reshape(64, 64)  # printed as a hex blob
    special = np.array([np.inf, -np.inf, 1.0, -0.0], jnp.bfloat16)
    assert_converts_bf16(lambda x: (x + big).astype(np.float32), np.ones((64, 64), jnp.bfloat16))
    assert_converts_bf16(lambda x: (x * special).astype(np.float32), np.full(4, 2, jnp.bfloat16))


def test_bfloat16_reduce_precision():
    assert_converts_bf16(lambda x: jax.lax.reduce_precision(x.astype(jnp.bfloat16) * 3, exponent_bits=5,
                                                            mantissa_bits=10).astype(jnp.float32), X * 1000)


def test_large_closed_over_constant():
    table = RNG.standard_normal(1 << 20).astype(np.float32)
    assert_converts(lambda i: jnp.take(jnp.asarray(table), i), np.array([0, 5, 1 << 19, (1 << 20) - 1], np.int32),
                    lowered=False)


# -- element types with no ONNX/Core ML counterpart --------------------------------------------


@pytest.mark.parametrize("fn, match", [
    (lambda x: (x.astype(jnp.complex64) * (1 + 2j)).real, r"element type complex<f32> .*complex numbers"),
    (lambda x: jnp.abs(jnp.fft.fft(x)), r"element type complex<f32> .*jnp.fft"),
    (lambda x: x.astype(jnp.float8_e4m3fn).astype(jnp.float32), r"element type f8E4M3FN .*8-bit"),
    (lambda x: x.astype(jnp.int4).astype(jnp.float32), r"element type i4 .*sub-byte"),
], ids=["complex-arithmetic", "fft", "float8", "int4"])
def test_unsupported_element_types_are_refused_by_op_and_line(fn, match):
    from jax_checks import export, to_onnx

    from edgebuild.plugin import BuildError

    with pytest.raises(BuildError, match=r"stablehlo\.\w+ at \S") as info:
        to_onnx(export(fn, X[0]))
    assert re.search(match, str(info.value)), str(info.value)


# -- trigonometric and other unary ops ------------------------------------------------------------


@pytest.mark.parametrize("fn, domain", [
    (jnp.tan, (-1.2, 1.2)), (jnp.arctan, (-4, 4)), (jnp.arcsin, (-0.95, 0.95)), (jnp.arccos, (-0.95, 0.95)),
    (jnp.sinh, (-3, 3)), (jnp.cosh, (-3, 3)), (jnp.arcsinh, (-4, 4)), (jnp.arccosh, (1.05, 5)),
    (jnp.arctanh, (-0.9, 0.9)), (jax.lax.erf, (-3, 3)), (jax.lax.erfc, (-3, 3)), (jax.lax.erf_inv, (-0.9, 0.9)),
    (jnp.exp2, (-3, 3)), (jnp.square, (-3, 3)), (lambda x: jax.lax.integer_pow(x, 3), (-2, 2)),
    (jax.lax.logistic, (-5, 5)), (jax.lax.lgamma, (0.5, 5)), (jax.lax.digamma, (0.5, 5)),
], ids=lambda v: getattr(v, "__name__", "") if callable(v) else "")
def test_unary_ops_match_jax(fn, domain):
    x = RNG.uniform(*domain, (3, 5)).astype(np.float32)
    assert_converts(fn, x, rtol=1e-4, atol=1e-5, lowered_tol=(2e-3, 2e-3))


def test_is_finite_and_nextafter():
    x = np.array([0.0, 1.0, -2.5, np.inf, -np.inf, np.nan], np.float32)
    assert_converts(jnp.isfinite, x)
    from jax_checks import export, to_onnx

    from edgebuild.plugin import BuildError

    with pytest.raises(BuildError, match=r"stablehlo.bitcast_convert at .*: this op is not supported"):
        to_onnx(export(jnp.nextafter, X, Y))  # a bit reinterpretation: ONNX 18 has no Bitcast


def test_round_half_away_from_zero():
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49999997, -0.49999997, 3.7, -3.2, 0.0], np.float32)
    round_afz = lambda x: jax.lax.round(x, jax.lax.RoundingMethod.AWAY_FROM_ZERO)
    assert_converts(round_afz, x, rtol=0, atol=0)
    assert_converts(jnp.round, x, rtol=0, atol=0)  # to nearest even


# -- shifts ---------------------------------------------------------------------------------------


SHIFT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


@pytest.mark.parametrize("dtype", SHIFT_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", ["shift_left", "shift_right_logical", "shift_right_arithmetic"])
def test_shifts_on_each_integer_type(kind, dtype):
    info = np.iinfo(dtype)
    width = info.bits
    a = np.array([info.min, info.max, 0, 1, 5, info.min + 3, info.max // 3, 7, 100 % (info.max + 1), 2, 3, 9],
                 dtype)
    amounts = np.array([0, 1, 2, width - 1, width, width + 3, 3, 1, 0, width - 2, 2, 4], dtype)
    if info.min < 0:
        a[-1] = -9
        amounts[-1] = -1  # a negative amount counts as a large one
    with jax.enable_x64(width == 64):
        assert_converts(getattr(jax.lax, kind), a, amounts, lowered=False)


def test_python_shift_operators_on_signed_ints():
    a = RNG.integers(-1000, 1000, (3, 4)).astype(np.int32)
    b = RNG.integers(0, 12, (3, 4)).astype(np.int32)
    assert_converts(lambda a, b: (a << b, a >> b), a, b, lowered=False)


CHLO_OPS = {"erf": (jax.lax.erf, (-3, 3)), "acos": (jnp.arccos, (-0.95, 0.95)), "asin": (jnp.arcsin, (-0.95, 0.95)),
            "atan": (jnp.arctan, (-4, 4)), "tan": (jnp.tan, (-1.2, 1.2)), "sinh": (jnp.sinh, (-3, 3)),
            "cosh": (jnp.cosh, (-3, 3)), "asinh": (jnp.arcsinh, (-4, 4)), "acosh": (jnp.arccosh, (1.05, 5)),
            "atanh": (jnp.arctanh, (-0.9, 0.9))}


@pytest.mark.parametrize("name", sorted(CHLO_OPS))
def test_bare_chlo_ops(name):
    """Modules written by other producers carry chlo ops outside a composite."""
    import onnx_ir as ir

    from jax_checks import run_lowered, run_onnxruntime

    from edgebuild_jax.convert.module import convert_module
    from edgebuild_jax.mlir import new_context, parse_module

    truth, domain = CHLO_OPS[name]
    text = (f"func.func @main(%x: tensor<3x5xf32>) -> tensor<3x5xf32> {{\n"
            f"  %0 = chlo.{name} %x : tensor<3x5xf32> -> tensor<3x5xf32>\n"
            f"  return %0 : tensor<3x5xf32>\n}}")
    context = new_context()
    module = parse_module(text.encode(), context, origin="bare.mlir")
    with context:
        model = ir.serde.serialize_model(convert_module(module, origin="bare"))
    x = RNG.uniform(*domain, (3, 5)).astype(np.float32)
    want = np.asarray(truth(x))
    np.testing.assert_allclose(run_onnxruntime(model, [x])[0], want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(run_lowered(model, [x])[0], want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.uint8, np.uint16, np.uint32], ids=lambda d: np.dtype(d).name)
def test_narrow_integer_arithmetic(dtype):
    a = np.arange(1, 13, dtype=dtype).reshape(3, 4)
    b = (np.arange(12).reshape(3, 4) % 5 + 1).astype(dtype)
    assert_converts(lambda a, b: (jnp.clip(a, 2, 9), jax.lax.clamp(b, a, b + 3), jnp.maximum(a, b),
                                  jnp.minimum(a, b), -a, jnp.abs(a), a + b, a * b, a - b, a // b, a % b,
                                  a < b, a != b, a & b, ~a), a, b, lowered=False)


def test_bfloat16_where_and_clamp():
    pick = RNG.random((2, 3, 4)) > 0.5
    assert_converts_bf16(lambda p, x, y: jnp.where(p, x.astype(jnp.bfloat16), jnp.clip(y.astype(jnp.bfloat16), -1, 1)),
                         pick, X, Y)
