import numpy as np
import pytest

from jax_checks import assert_converts, jax, jnp

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 4)).astype(np.float32)
I = RNG.integers(-9, 9, (2, 3, 4)).astype(np.int32)
AXES = [None, 0, 1, 2, -1, (0, 2), (1, 2)]


@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("fn", [jnp.sum, jnp.max, jnp.min, jnp.prod], ids=lambda f: f.__name__)
def test_float_reductions_over_any_axes(fn, axis, keepdims):
    assert_converts(lambda x: fn(x, axis=axis, keepdims=keepdims), X, rtol=1e-5, atol=1e-5,
                    lowered_tol=(1e-3, 1e-4))


@pytest.mark.parametrize("axis", [None, 1, (0, 2)], ids=str)
@pytest.mark.parametrize("fn", [jnp.sum, jnp.max, jnp.min], ids=lambda f: f.__name__)
def test_integer_reductions(fn, axis):
    assert_converts(lambda x: fn(x, axis=axis), I)


@pytest.mark.parametrize("axis", [0, 2])
def test_integer_argmax_argmin(axis):
    assert_converts(lambda x: (jnp.argmax(x, axis=axis), jnp.argmin(x, axis=axis)), I)


@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("fn", [jnp.any, jnp.all], ids=lambda f: f.__name__)
def test_boolean_reductions(fn, axis):
    assert_converts(lambda x: fn(x > 0.3, axis=axis), X)


def test_a_non_identity_init_is_combined_with_the_result():
    assert_converts(lambda x: jax.lax.reduce(x, np.float32(2.5), jax.lax.add, (1,)), X)
    assert_converts(lambda x: jax.lax.reduce(x, np.float32(0.5), jax.lax.max, (0, 2)), X)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("fn", [jnp.argmax, jnp.argmin], ids=lambda f: f.__name__)
def test_argmax_argmin_over_each_axis(fn, axis):
    assert_converts(lambda x: fn(x, axis=axis), X)


def test_reductions_built_on_reduce():
    assert_converts(lambda x: (jnp.mean(x, axis=1), jnp.var(x, axis=(0, 2)), jnp.max(x, axis=1, initial=0.25),
                               jnp.count_nonzero(x > 0, axis=2)), X, lowered_tol=(1e-3, 1e-4))


def test_half_precision_reductions():
    assert_converts(lambda x: (jnp.sum(x, axis=1), jnp.max(x, axis=0), jnp.argmax(x, axis=2)),
                    X.astype(np.float16), rtol=1e-2, atol=1e-2)


def test_logsumexp_over_axes():
    assert_converts(lambda x: (jax.nn.logsumexp(x, axis=1), jax.nn.logsumexp(x, axis=(0, 2))), X,
                    lowered_tol=(1e-3, 1e-4))


def test_other_reduce_bodies_are_refused():
    from jax_checks import export, to_onnx
    from edgebuild.plugin import BuildError

    def body(a, b):
        return a * 2 + b
    exported = export(lambda x: jax.lax.reduce(x, np.float32(0), body, (1,)), X)
    with pytest.raises(BuildError, match="stablehlo.multiply"):
        to_onnx(exported)


def test_other_two_operand_reduces_are_refused():
    from jax_checks import export, to_onnx
    from edgebuild.plugin import BuildError

    def pairwise_sum(a, b):
        return a[0] + b[0], a[1] * b[1]
    exported = export(lambda x, y: jax.lax.reduce((x, y), (np.float32(0), np.float32(1)), pairwise_sum, (1,)),
                      X, X)
    with pytest.raises(BuildError, match="stablehlo.add, stablehlo.multiply"):
        to_onnx(exported)


NHWC = RNG.standard_normal((2, 7, 6, 3)).astype(np.float32)
NCHW = RNG.standard_normal((2, 3, 7, 6)).astype(np.float32)


def _pool_shape(layout, window, strides):
    if layout == "NHWC":
        return (1, *window, 1), (1, *strides, 1)
    return (1, 1, *window), (1, 1, *strides)


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("window,strides", [((2, 2), (2, 2)), ((3, 3), (1, 1)), ((3, 2), (2, 1))], ids=str)
@pytest.mark.parametrize("padding", ["VALID", "SAME", ((1, 1), (0, 1))], ids=str)
def test_max_pool(layout, window, strides, padding):
    x = NHWC if layout == "NHWC" else NCHW
    dims, steps = _pool_shape(layout, window, strides)
    pads = padding if isinstance(padding, str) else (((0, 0),) + padding + ((0, 0),) if layout == "NHWC"
                                                       else ((0, 0), (0, 0)) + padding)
    assert_converts(lambda x: jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, dims, steps, pads), x)


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("window,strides", [((2, 2), (2, 2)), ((3, 3), (1, 1)), ((3, 2), (2, 1))], ids=str)
@pytest.mark.parametrize("padding", ["VALID", "SAME"])
def test_sum_and_avg_pool(layout, window, strides, padding):
    x = NHWC if layout == "NHWC" else NCHW
    dims, steps = _pool_shape(layout, window, strides)

    def pools(x):
        total = jax.lax.reduce_window(x, 0.0, jax.lax.add, dims, steps, padding)
        return total, total / np.prod(window)
    assert_converts(pools, x, rtol=1e-5, atol=1e-5, lowered_tol=(1e-3, 1e-4))


def test_flax_pools():
    nn = pytest.importorskip("flax.linen")
    assert_converts(lambda x: nn.max_pool(x, (2, 2), strides=(2, 2)), NHWC)
    assert_converts(lambda x: nn.avg_pool(x, (3, 3), strides=(1, 1), padding="SAME"), NHWC,
                    lowered_tol=(1e-3, 1e-4))


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_one_dimensional_windows_over_any_dim(dim):
    window = [1, 1, 1]
    window[dim] = 2
    assert_converts(lambda x: jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, window, window, "VALID")
                    if X.shape[dim] % 2 == 0 else
                    jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, window, [1, 1, 1], "VALID"), X)


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("fn", [jnp.cumsum, jax.lax.cummax, jax.lax.cummin], ids=lambda f: f.__name__)
def test_cumulative_scans_are_windows_over_one_dim(fn, axis):
    assert_converts(lambda x: fn(x, axis=axis), X, lowered_tol=(1e-3, 1e-4))


@pytest.mark.parametrize("padding", ["VALID", "SAME"])
def test_min_window(padding):
    assert_converts(lambda x: jax.lax.reduce_window(x, jnp.inf, jax.lax.min, (1, 2, 3), (1, 1, 2), padding), X)


def test_dilated_max_window():
    assert_converts(lambda x: jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 1, 1, 1),
                                                    "VALID", window_dilation=(1, 2, 2, 1)), NHWC)


def test_base_dilation_is_refused():
    from jax_checks import export, to_onnx
    from edgebuild.plugin import BuildError

    exported = export(lambda x: jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 1, 1, 1),
                                                      "VALID", base_dilation=(1, 2, 2, 1)), NHWC)
    with pytest.raises(BuildError, match="base_dilations"):
        to_onnx(exported)


SORTABLE = RNG.permutation(24).reshape(2, 3, 4).astype(np.float32) - 10  # distinct: no ties to order


def needs(*op_names):
    """Skip when another family's op (jnp's descending flip, top_k's slice) is not converted yet."""
    from edgebuild_jax.convert.registry import supported_ops

    missing = [name for name in op_names if name not in supported_ops()]
    if missing:
        pytest.skip(f"{', '.join(missing)} not converted")


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_and_argsort(axis, descending):
    if descending:
        needs("stablehlo.reverse")
    assert_converts(lambda x: (jnp.sort(x, axis=axis, descending=descending),
                               jnp.argsort(x, axis=axis, descending=descending)), SORTABLE)


def _converted_text(text):
    import onnx_ir as ir

    from edgebuild_jax.convert.module import convert_module
    from edgebuild_jax.mlir import new_context, parse_module

    context = new_context()
    module = parse_module(text.encode(), context, origin="test.mlir")
    with context:
        return ir.serde.serialize_model(convert_module(module, origin="test"))


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])  # floats: the total-order pattern; ints: one compare
def test_a_greater_than_comparator_sorts_descending(axis, dtype):
    """JAX writes descending sorts as an ascending one and a flip; a GT comparator (as other
    producers write) is the ascending module with its comparison turned round."""
    from jax_checks import export, run_lowered, run_onnxruntime

    x = SORTABLE.astype(dtype)
    fn = lambda x: jax.lax.sort((x, jax.lax.broadcasted_iota(np.int32, x.shape, axis)), dimension=axis)
    text = export(fn, x).mlir_module()
    assert text.count("compare  LT") + text.count("compare LT") == 1
    model = _converted_text(text.replace("compare  LT", "compare  GT").replace("compare LT", "compare GT"))
    want_indices = np.flip(np.argsort(x, axis=axis), axis=axis)
    want = [np.take_along_axis(x, want_indices, axis=axis), want_indices]
    runs = [run_onnxruntime(model, [x])] + ([run_lowered(model, [x])] if dtype == np.float32 else [])
    for got in runs:
        np.testing.assert_allclose(got[0], want[0])
        assert np.array_equal(np.asarray(got[1]), want[1])


@pytest.mark.parametrize("dtype", [np.int32, np.float16])
def test_sort_of_other_dtypes(dtype):
    assert_converts(lambda x: (jnp.sort(x, axis=1), jnp.argsort(x, axis=1)), SORTABLE.astype(dtype))


@pytest.mark.parametrize("dimension", [0, 1, 2])
def test_lax_sort_with_several_operands(dimension):
    other = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    labels = RNG.integers(0, 100, (2, 3, 4)).astype(np.int32)
    assert_converts(lambda x, y, z: jax.lax.sort((x, y, z), dimension=dimension, num_keys=1),
                    SORTABLE, other, labels)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_top_k(k):
    needs("stablehlo.slice")
    assert_converts(lambda x: jax.lax.top_k(x, k), SORTABLE)


def test_a_comparator_on_two_keys_is_refused():
    from jax_checks import export, to_onnx
    from edgebuild.plugin import BuildError

    exported = export(lambda x, y: jax.lax.sort((x, y), dimension=1, num_keys=2), SORTABLE, SORTABLE)
    with pytest.raises(BuildError, match="comparator"):
        to_onnx(exported)


@pytest.mark.parametrize("axis", [0, 1])
def test_argsort_keeps_ties_in_order(axis):
    ties = RNG.integers(0, 3, (3, 8)).astype(np.float32)  # few values: many equal keys
    assert_converts(lambda x: (jnp.argsort(x, axis=axis, stable=True), jnp.sort(x, axis=axis)), ties)
