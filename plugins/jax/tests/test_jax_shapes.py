import numpy as np
import pytest

from jax_checks import assert_converts, jax, jnp

lax = jax.lax
RNG = np.random.default_rng(0)
X = RNG.standard_normal((6, 5, 4)).astype(np.float32)


@pytest.mark.parametrize("index", [np.s_[1:5:2], np.s_[:, 1:4], np.s_[..., ::3], np.s_[2:, :-1, 1:3:2]],
                         ids=["rows-stride2", "middle", "last-stride3", "all-dims"])
def test_static_slices_match_jax(index):
    assert_converts(lambda x: x[index], X)


@pytest.mark.parametrize("starts", [(0, 0, 0), (2, 1, 3), (5, 4, 3), (-3, 9, 100)],
                         ids=["zero", "inside", "edge", "out-of-range-clamped"])
def test_dynamic_slice_with_constant_starts_matches_jax(starts):
    assert_converts(lambda x: lax.dynamic_slice(x, starts, (3, 2, 2)), X)


@pytest.mark.parametrize("dtype", [np.int32])
@pytest.mark.parametrize("starts", [(0, 0), (2, 1), (7, -4), (-2, 30)], ids=["zero", "inside", "high-low", "low-high"])
def test_dynamic_slice_with_traced_starts_matches_jax(starts, dtype):
    i, j = (np.asarray(s, dtype) for s in starts)
    assert_converts(lambda x, i, j: lax.dynamic_slice(x, (i, j, jnp.zeros((), dtype)), (2, 3, 4)), X, i, j)


@pytest.mark.parametrize("starts", [(1, 2, 0), (5, 5, 5), (-1, 0, 1)], ids=["inside", "clamped-high", "clamped-low"])
def test_dynamic_update_slice_matches_jax(starts):
    update = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    assert_converts(lambda x, u: lax.dynamic_update_slice(x, u, starts), X, update)
    i = np.asarray(starts[0], np.int32)
    assert_converts(lambda x, u, i: lax.dynamic_update_slice(x, u, (i, 1, 0)), X, update, i)


@pytest.mark.parametrize("widths", [((1, 2), (0, 0), (3, 1)), ((0, 0), (2, 2), (0, 0)), 1])
@pytest.mark.parametrize("mode", ["constant", "edge-value"])
def test_jnp_pad_matches_jax(widths, mode):
    value = 0.0 if mode == "constant" else 2.5
    assert_converts(lambda x: jnp.pad(x, widths, constant_values=value), X)


@pytest.mark.parametrize("config", [
    [(1, 2, 0), (0, 0, 0), (0, 0, 0)],
    [(-2, 1, 0), (0, -1, 0), (1, -3, 0)],
    [(0, 0, 1), (0, 0, 0), (0, 0, 2)],
    [(1, 0, 2), (-1, 2, 1), (0, -2, 1)],
], ids=["edges", "negative", "interior", "mixed"])
def test_lax_pad_with_negative_and_interior_padding_matches_jax(config):
    assert_converts(lambda x: lax.pad(x, np.float32(-1.0), config), X)


@pytest.mark.parametrize("config", [[(1, -1, 1), (0, 2, 0)], [(2, 3, 0), (-1, 1, 2)], [(0, 0, 3), (0, 0, 0)]])
@pytest.mark.parametrize("dtype", [np.int32, np.bool_])
def test_pad_of_integers_and_booleans_matches_jax(config, dtype):
    x = (np.arange(12).reshape(3, 4) % 5).astype(dtype)
    assert_converts(lambda x: lax.pad(x, dtype(1), config), x)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_concatenate_matches_jax(axis):
    shape = list(X.shape)
    shape[axis] = 2
    other = RNG.standard_normal(shape).astype(np.float32)
    assert_converts(lambda a, b: jnp.concatenate([a, b, a], axis=axis), X, other)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.int32, jnp.float16, jnp.int8])
def test_arange_and_iota_match_jax(dtype):
    x = np.ones((3, 4), np.float32)
    assert_converts(lambda x: x + jnp.arange(4, dtype=dtype).astype(jnp.float32), x)
    for dimension in (0, 1):
        assert_converts(lambda x: x * lax.broadcasted_iota(dtype, (3, 4), dimension).astype(jnp.float32), x)


@pytest.mark.parametrize("axis", [0, 1, 2, (0, 2), None])
def test_flip_matches_jax(axis):
    assert_converts(lambda x: jnp.flip(x, axis=axis), X)


# -- gather -------------------------------------------------------------------------------------

IDS = np.asarray([3, 0, 5, 5, 1], np.int32)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_take_along_any_axis_matches_jax(axis):
    ids = np.asarray([[1, 0], [3, 2]], np.int32)
    assert_converts(lambda x, i: jnp.take(x, i, axis=axis), X, ids)


@pytest.mark.parametrize("index", [lambda x, i: x[i], lambda x, i: x[:, i % 5], lambda x, i: x[..., i % 4],
                                   lambda x, i: x[i, i % 5], lambda x, i: x[i, :, i % 4]],
                         ids=["rows", "columns", "last", "two-dims", "split-dims"])
def test_integer_array_indexing_matches_jax(index):
    assert_converts(index, X, IDS)


def test_embedding_lookup_matches_jax():
    table = RNG.standard_normal((50, 8)).astype(np.float32)
    ids = RNG.integers(0, 50, size=(2, 7)).astype(np.int32)
    assert_converts(lambda t, i: t[i], table, ids)
    assert_converts(lambda t, i: jnp.take(t, i, axis=0), table, ids)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_take_along_axis_matches_jax(axis):
    shape = list(X.shape)
    shape[axis] = 3
    ids = RNG.integers(0, X.shape[axis], size=shape).astype(np.int32)
    assert_converts(lambda x, i: jnp.take_along_axis(x, i, axis=axis), X, ids)


def test_gather_with_out_of_range_index_is_clamped_like_jax():
    ids = np.asarray([[0, 9], [2, 3], [7, 1]], np.int32)
    fn = lambda x, i: lax.gather(  # noqa: E731
        x, i, lax.GatherDimensionNumbers(offset_dims=(1, 2), collapsed_slice_dims=(0,), start_index_map=(0, 1)),
        slice_sizes=(1, 3, 4), mode=lax.GatherScatterMode.CLIP)
    assert_converts(fn, X, ids)


def test_one_hot_matches_jax():
    ids = np.asarray([0, 3, 2, 9], np.int32)
    assert_converts(lambda i: jax.nn.one_hot(i, 10), ids)


# -- scatter ------------------------------------------------------------------------------------

UNIQUE = np.asarray([4, 0, 2], np.int32)


@pytest.mark.parametrize("kind", ["set", "add", "max", "min", "multiply"])
def test_at_updates_match_jax(kind):
    updates = RNG.standard_normal((3, 5, 4)).astype(np.float32)
    assert_converts(lambda x, i, u: getattr(x.at[i], kind)(u), X, UNIQUE, updates)


@pytest.mark.parametrize("kind", ["set", "add", "max"])
def test_at_updates_of_columns_and_points_match_jax(kind):
    columns = RNG.standard_normal((6, 3, 4)).astype(np.float32)
    assert_converts(lambda x, i, u: getattr(x.at[:, i], kind)(u), X, UNIQUE, columns)
    points = RNG.standard_normal((3, 4)).astype(np.float32)
    assert_converts(lambda x, i, u: getattr(x.at[i, i], kind)(u), X, UNIQUE, points)


def test_scatter_add_with_repeated_indices_sums_like_jax():
    updates = RNG.standard_normal((5, 5, 4)).astype(np.float32)
    assert_converts(lambda x, i, u: x.at[i].add(u), X, IDS, updates)


def test_scatter_with_another_body_is_refused():
    from jax_checks import export, to_onnx
    from edgebuild.plugin import BuildError

    dnums = lax.ScatterDimensionNumbers(update_window_dims=(1, 2), inserted_window_dims=(0,),
                                        scatter_dims_to_operand_dims=(0,))
    fn = lambda x, i: lax.scatter_apply(x, i[:, None], jnp.sin, dnums, update_shape=(3, 5, 4))  # noqa: E731
    with pytest.raises(BuildError, match="update body .*sine"):
        to_onnx(export(fn, X, UNIQUE))


# -- batching dims and dtypes -------------------------------------------------------------------

def test_batched_gather_and_scatter_match_jax():
    ids = RNG.integers(-5, 5, size=(6, 2)).astype(np.int32)  # negative ids count from the end
    assert_converts(jax.vmap(lambda x, i: x[i]), X, ids)
    assert_converts(jax.vmap(lambda x, i: x[:, i]), X, ids % 4)
    updates = RNG.standard_normal((6, 2, 4)).astype(np.float32)
    distinct = np.stack([RNG.permutation(5)[:2] for _ in range(6)]).astype(np.int32)
    assert_converts(jax.vmap(lambda x, i, u: x.at[i].set(u)), X, distinct, updates)
    assert_converts(jax.vmap(lambda x, i, u: x.at[i].add(u)), X, ids, updates)


@pytest.mark.parametrize("dtype", [np.float16, np.int32])
def test_gather_and_scatter_of_other_element_types_match_jax(dtype):
    x = (X * 10).astype(dtype)
    assert_converts(lambda x, i: x[i], x, IDS, rtol=1e-3, atol=1e-3)
    updates = (RNG.standard_normal((3, 5, 4)) * 10).astype(dtype)
    assert_converts(lambda x, i, u: x.at[i].set(u), x, UNIQUE, updates, rtol=1e-3, atol=1e-3)


def test_negative_indices_count_from_the_end_like_jax():
    ids = np.asarray([-1, -6, 2], np.int32)
    assert_converts(lambda x, i: x[i], X, ids)
    updates = RNG.standard_normal((3, 5, 4)).astype(np.float32)
    assert_converts(lambda x, i, u: x.at[i].add(u), X, ids, updates)


@pytest.mark.parametrize("kind", ["set", "add", "max"])
def test_scatter_drops_out_of_range_updates_like_jax(kind):
    ids = np.asarray([7, 2, -9, 100], np.int32)
    updates = RNG.standard_normal((4, 5, 4)).astype(np.float32)
    assert_converts(lambda x, i, u: getattr(x.at[i], kind)(u), X, ids, updates)
    window = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    starts = np.asarray([[1, 1], [0, 3]], np.int32)  # the second window runs past dim 1: dropped
    dnums = lax.ScatterDimensionNumbers(update_window_dims=(1, 2), inserted_window_dims=(0,),
                                        scatter_dims_to_operand_dims=(0, 1))
    assert_converts(lambda x, i, u: lax.scatter(x, i, u[:, :, :], dnums, mode=lax.GatherScatterMode.FILL_OR_DROP),
                    X, starts, window)


def test_batched_dynamic_slice_and_update_match_jax():
    # under vmap these become a gather and a scatter with windows wider than one element
    starts = np.asarray([[0, 1], [4, 3], [-2, 9], [2, 0], [1, 1], [3, 2]], np.int32)
    fn = jax.vmap(lambda x, s: lax.dynamic_slice(x, (s[0], s[1]), (2, 3)))
    assert_converts(fn, X, starts)
    window = RNG.standard_normal((6, 2, 3)).astype(np.float32)
    fn = jax.vmap(lambda x, s, u: lax.dynamic_update_slice(x, u, (s[0], s[1])))
    assert_converts(fn, X, starts, window)


@pytest.mark.parametrize("dtype", [np.int32, np.bool_, np.float16])
def test_data_movement_of_other_element_types_matches_jax(dtype):
    x = (X > 0).astype(dtype) if dtype == np.bool_ else (X * 10).astype(dtype)
    assert_converts(lambda x: x[1:5:2, ::-1], x, rtol=1e-3, atol=1e-3)
    assert_converts(lambda x: jnp.concatenate([x, x[:, :2]], axis=1), x, rtol=1e-3, atol=1e-3)
    assert_converts(lambda x, i: lax.dynamic_slice(x, (i, i, i), (2, 2, 2)), x, np.int32(3), rtol=1e-3, atol=1e-3)
    assert_converts(lambda x: lax.dynamic_update_slice(x, x[:2, :2, :2], (4, 3, 1)), x, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("kind", ["set", "max", "min"])
def test_boolean_scatter_matches_jax(kind):
    mask = X > 0
    flags = RNG.standard_normal((3, 5, 4)) > 0
    assert_converts(lambda m, i, f: getattr(m.at[i], kind)(f), mask, UNIQUE, flags)


def test_boolean_gathers_match_jax():
    mask = X > 0
    assert_converts(lambda m, i: m[i], mask, IDS)
    assert_converts(lambda m, i: m[:, i % 5], mask, IDS)


def test_scalar_dynamic_slice_and_update_match_jax():
    s = np.asarray(1.5, np.float32)
    assert_converts(lambda s: lax.dynamic_slice(s, (), ()), s)
    assert_converts(lambda s, t: lax.dynamic_update_slice(s, t, ()), s, np.asarray(2.0, np.float32))
