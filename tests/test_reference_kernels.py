"""The shared numpy kernels (edgebuild.reference) against closed forms computed in float64
with the standard library, including NaN, infinities and magnitudes that overflow a naive
formula. Every case runs with overflow, division by zero and invalid operations raised as
errors: a kernel must not trip over them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgebuild.reference import activations, attention, normalization, reductions, resampling, slices, special

RNG = np.random.default_rng(7)
EXTREMES = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1000.0, -1000.0, 88.0, -88.0, 1e-30, -1e-30])


@pytest.fixture(autouse=True)
def warnings_are_errors():
    with np.errstate(over="raise", divide="raise", invalid="raise", under="ignore"):
        yield


def _closed(fn, x) -> np.ndarray:
    """``fn`` of every value in float64 arithmetic of the standard library."""
    return np.array([fn(float(v)) for v in np.ravel(x)]).reshape(np.shape(x))


def _sigmoid(v: float) -> float:
    if math.isnan(v):
        return math.nan
    return 1 / (1 + math.exp(-v)) if v >= 0 else math.exp(v) / (1 + math.exp(v))


def test_erf_is_within_a_few_ulps_of_math_erf():
    x = np.concatenate([RNG.uniform(-7, 7, 20000), RNG.standard_normal(2000) * 1e-3,
                        [0.0, 1.5, -1.5, 6.0, -6.0, 1e-300, 5e-324, 30.0]])
    got, want = special.erf(x), _closed(math.erf, x)
    assert got.dtype == np.float64
    ulps = np.abs(got - want) / np.spacing(np.abs(want))
    assert ulps.max() <= 4


def test_erf_of_special_values_and_float32():
    got = special.erf(np.array([np.nan, np.inf, -np.inf, -0.0]))
    assert np.isnan(got[0]) and list(got[1:]) == [1.0, -1.0, 0.0] and np.signbit(got[3])
    x = RNG.uniform(-4, 4, 1000).astype(np.float32)
    got = special.erf(x)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, _closed(math.erf, x).astype(np.float32))  # one rounding


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sigmoid_never_overflows(dtype):
    x = np.concatenate([EXTREMES, RNG.standard_normal(100) * 50]).astype(dtype)
    got = activations.sigmoid(x)
    assert got.dtype == dtype
    assert activations.sigmoid(np.array([-1000.0]))[0] == 0.0 and activations.sigmoid(np.array([1000.0]))[0] == 1.0
    want = _closed(_sigmoid, x).astype(dtype)  # float32: below its range is 0, as in the closed form
    np.testing.assert_allclose(got, want, rtol=2e-7 if dtype == np.float32 else 1e-15, atol=1e-44)


def test_elementwise_kernels_work_slice_by_slice(monkeypatch):
    monkeypatch.setattr(slices, "SLICE_VALUES", 7)  # slice edges everywhere
    x = (RNG.standard_normal((5, 6, 7)) * 20).astype(np.float32)
    x.reshape(-1)[:4] = [np.nan, np.inf, -np.inf, 0.0]
    np.testing.assert_allclose(activations.sigmoid(x), _closed(_sigmoid, x).astype(np.float32), rtol=2e-7, atol=1e-44)
    np.testing.assert_array_equal(special.erf(x), _closed(math.erf, x).astype(np.float32))


def test_silu_writes_into_out_and_keeps_ieee_results():
    x = np.concatenate([EXTREMES, RNG.standard_normal(50) * 30])
    with np.errstate(invalid="ignore"):  # the closed form's own -inf * 0
        want = np.array([v * _sigmoid(v) for v in x])
    np.testing.assert_allclose(activations.silu(x), want, rtol=1e-15, atol=0)
    assert activations.silu(np.array([-1000.0]))[0] == 0.0
    own = x.copy()
    assert activations.silu(own, out=own) is own
    np.testing.assert_allclose(own, want, rtol=1e-15, atol=0)


def test_float32_sigmoid_and_silu_take_the_direct_form_within_float32_rounding(monkeypatch):
    """float32 slices above -88 compute 1 / (1 + exp(-x)) and x / (1 + exp(-x)) directly; slices
    reaching below (where exp(-x) would overflow) or holding a NaN go the stable way."""
    monkeypatch.setattr(slices, "SLICE_VALUES", 64)
    direct = np.linspace(-88, 88, 64 * 50, dtype=np.float32)
    mixed = RNG.permutation(np.concatenate([direct, EXTREMES.astype(np.float32), [-88.5, -95.0, -103.0]]))
    for x in (direct, mixed.astype(np.float32), (RNG.standard_normal((3, 40, 7)) * 30).astype(np.float32)):
        with np.errstate(invalid="ignore"):  # the closed form's own -inf * 0
            want_silu = _closed(lambda v: v * _sigmoid(v), x)
        want_sigmoid = _closed(_sigmoid, x).astype(np.float32)
        np.testing.assert_allclose(activations.sigmoid(x), want_sigmoid, rtol=3e-7, atol=1e-44)
        got = activations.silu(x)
        assert got.dtype == np.float32
        # atol: below -88 the stable form multiplies a denormal sigmoid, of a few significant bits
        np.testing.assert_allclose(got, want_silu.astype(np.float32), rtol=3e-7, atol=1e-40)
        own = x.copy()
        assert activations.silu(own, out=own) is own
        np.testing.assert_array_equal(own, got)
        strided = np.empty(x.shape[::-1], np.float32).T  # an ``out`` with no flat view
        assert activations.silu(x, out=strided) is strided
        np.testing.assert_array_equal(strided, got)


@pytest.mark.parametrize("mode", ["none", "tanh", "sigmoid"])
def test_gelu_modes(mode):
    closed = {
        "none": lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))),
        "tanh": lambda v: 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))),
        "sigmoid": lambda v: v * _sigmoid(1.702 * v),
    }[mode]
    x = np.concatenate([RNG.standard_normal(200) * 4, [0.0, 50.0, -50.0, 1e5, -1e5]])
    # atol: the tanh form cancels (1 + tanh -> 0) for negative x, in any float64 evaluation
    np.testing.assert_allclose(activations.gelu(x, mode), _closed(closed, x), rtol=1e-13, atol=1e-15)
    assert activations.gelu(x.astype(np.float32), mode).dtype == np.float32
    with pytest.raises(ValueError, match="approximate"):
        activations.gelu(x, "erf")


def test_hard_sigmoid_leaky_relu_softplus():
    x = np.concatenate([EXTREMES[1:], RNG.standard_normal(50) * 10])
    np.testing.assert_array_equal(activations.hard_sigmoid(x, 0.2, 0.5), np.clip(0.2 * x + 0.5, 0, 1))
    np.testing.assert_array_equal(activations.leaky_relu(x, 0.1), np.array([v if v >= 0 else 0.1 * v for v in x]))
    closed = lambda v: max(v, 0.0) + math.log1p(math.exp(-abs(v)))  # noqa: E731
    np.testing.assert_allclose(activations.softplus(x), _closed(closed, x), rtol=1e-15, atol=0)


def test_softmax_of_large_values_and_extremes():
    x = np.array([[1000.0, 999.0, -1000.0], [-np.inf, 0.0, 0.0], [3.0, 3.0, 3.0]])
    got = reductions.softmax(x, axis=-1)
    e = math.exp(-1.0)
    np.testing.assert_allclose(got, [[1 / (1 + e), e / (1 + e), 0.0], [0.0, 0.5, 0.5], [1 / 3] * 3], rtol=1e-15)
    np.testing.assert_allclose(reductions.softmax(x.T, axis=0), got.T, rtol=1e-15)
    assert reductions.softmax(x.astype(np.float32)).dtype == np.float32


def test_log_sum_exp_of_large_values_and_infinities():
    x = np.array([[1000.0, 1000.0], [-1000.0, -1000.0], [-np.inf, -np.inf], [np.inf, 1.0]])
    got = reductions.log_sum_exp(x, axis=1)
    np.testing.assert_allclose(got, [1000 + math.log(2), -1000 + math.log(2), -np.inf, np.inf], rtol=1e-15)
    assert reductions.log_sum_exp(x[:2], keepdims=True).shape == (1, 1)


def test_standardize_and_batch_normalize():
    x = RNG.standard_normal((2, 3, 4)) * 1e3 + 5e3
    got = normalization.standardize(x, (1, 2), 1e-5)
    for sample, row in zip(x, got):
        values = sample.ravel().tolist()
        mean = math.fsum(values) / len(values)
        variance = math.fsum((v - mean) ** 2 for v in values) / len(values)
        np.testing.assert_allclose(row.ravel(), [(v - mean) / math.sqrt(variance + 1e-5) for v in values], rtol=1e-12)
    mean, variance = np.array([[1.0], [2.0]]), np.array([[4.0], [0.0]])
    got = normalization.batch_normalize(np.ones((2, 3)), mean, variance, 1e-12, np.full((2, 1), 2.0), 1.0)
    np.testing.assert_allclose(got, [[1.0] * 3, [1 - 2 / math.sqrt(1e-12)] * 3], rtol=1e-15)


def test_attention_with_scale_default_scale_and_masks():
    q, k, v = RNG.standard_normal((2, 3, 4)), RNG.standard_normal((2, 5, 4)), RNG.standard_normal((2, 5, 6))
    additive = RNG.standard_normal((3, 5))

    def closed(scale, mask):
        out = np.empty((2, 3, 6))
        for b, i in np.ndindex(2, 3):
            scores = [math.fsum(q[b, i] * k[b, j]) * scale + mask[i, j] for j in range(5)]
            peak = max(scores)
            weights = [math.exp(s - peak) for s in scores]
            out[b, i] = [math.fsum(w * v[b, j, c] for j, w in enumerate(weights)) / math.fsum(weights) for c in range(6)]
        return out

    np.testing.assert_allclose(attention.scaled_dot_product_attention(q, k, v, additive, 0.35), closed(0.35, additive),
                               rtol=1e-12)
    np.testing.assert_allclose(attention.scaled_dot_product_attention(q, k, v), closed(0.5, np.zeros((3, 5))),
                               rtol=1e-12)
    keep = np.ones((3, 5), bool)
    keep[:, 1] = False
    with np.errstate(invalid="ignore"):  # -inf scores in the closed form
        want = closed(0.5, np.where(keep, 0.0, -np.inf))
    np.testing.assert_allclose(attention.scaled_dot_product_attention(q, k, v, keep), want, rtol=1e-12)


def test_linear_along_clamps_or_fills():
    arr = np.arange(12, dtype=np.float64).reshape(3, 4)
    got = resampling.linear_along(arr, 1, np.array([-1.0, 0.5, 2.25, 5.0]))
    np.testing.assert_allclose(got, [[0.0, 0.5, 2.25, 3.0], [4.0, 4.5, 6.25, 7.0], [8.0, 8.5, 10.25, 11.0]])
    filled = resampling.linear_along(arr, 0, np.array([-0.5, 1.5, 2.5]), fill=-7.0)
    np.testing.assert_allclose(filled, [[-7.0] * 4, [6.0, 7.0, 8.0, 9.0], [-7.0] * 4])
