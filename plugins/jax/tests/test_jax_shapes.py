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


def test_pad_of_integers_matches_jax():
    # Core ML's constant pad takes floats only, so only onnxruntime checks this
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    assert_converts(lambda x: lax.pad(x, np.int32(7), [(1, -1, 1), (0, 2, 0)]), x, lowered=False)


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
