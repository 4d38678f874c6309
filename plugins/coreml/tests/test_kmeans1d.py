"""The fast 1-D k-means against scikit-learn and against exhaustive search."""

from itertools import combinations

import numpy as np
import pytest
from coremltools._deps import _kmeans1d
from sklearn.cluster import KMeans

from edgebuild_coreml.compress.kmeans1d import kmeans1d, palettize_groups


def _mse(values, centroids, labels):
    return float(np.mean((values.ravel() - centroids[labels.ravel()]) ** 2))


def _tensors():
    rng = np.random.default_rng(1234)
    return {
        "normal": rng.standard_normal(6000),
        "laplace": rng.laplace(scale=0.05, size=6000),
        "duplicates": rng.integers(-20, 20, size=6000) * 0.25,
    }


@pytest.mark.parametrize("name", ["normal", "laplace", "duplicates"])
@pytest.mark.parametrize("k", [2, 4, 16])
def test_not_worse_than_sklearn(name, k):
    values = _tensors()[name]
    centroids, labels = kmeans1d(values, k)
    sklearn = KMeans(n_clusters=k, n_init=3, random_state=0).fit(values.reshape(-1, 1))
    sklearn_mse = sklearn.inertia_ / values.size
    assert _mse(values, centroids, labels) <= sklearn_mse * 1.001 + 1e-12


def _brute_force_optimum(values, k):
    """Least squared error over every split of the sorted values into k contiguous runs."""
    x = np.sort(values)
    best = np.inf
    for cuts in combinations(range(1, len(x)), k - 1):
        runs = np.split(x, cuts)
        best = min(best, sum(float(((run - run.mean()) ** 2).sum()) for run in runs))
    return best


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("k", [2, 3, 4])
def test_equals_exhaustive_optimum_on_tiny_inputs(seed, k):
    rng = np.random.default_rng(seed)
    values = np.round(rng.standard_normal(11), 1)  # rounding makes ties likely
    centroids, labels = kmeans1d(values, k)
    ours = float(((values - centroids[labels]) ** 2).sum())
    assert ours == pytest.approx(_brute_force_optimum(values, k), rel=1e-9, abs=1e-12)


def test_fewer_unique_values_than_clusters_is_exact():
    values = np.array([0.5, -1.0, 0.5, 2.0, -1.0, 2.0, 2.0])
    centroids, labels = kmeans1d(values, 16)
    assert centroids.shape == (16,)
    np.testing.assert_array_equal(centroids[labels], values)
    assert np.all(np.diff(centroids) >= 0)


def test_sample_weights_pull_centroids():
    values = np.array([0.0, 1.0, 10.0])
    centroids, labels = kmeans1d(values, 2, weights=np.array([1.0, 3.0, 1.0]))
    # {0, 1} with weights 1 and 3 has its weighted mean at 0.75.
    np.testing.assert_allclose(centroids, [0.75, 10.0])
    np.testing.assert_array_equal(labels, [0, 0, 1])


def test_groups_match_one_call_per_group():
    rng = np.random.default_rng(7)
    matrix = rng.standard_normal((40, 512)).astype(np.float16)
    luts, labels = palettize_groups(matrix, 16)
    assert luts.shape == (40, 16) and labels.shape == matrix.shape and labels.dtype == np.uint8
    for row in (0, 17, 39):
        centroids, row_labels = kmeans1d(matrix[row], 16)
        np.testing.assert_allclose(luts[row], centroids)
        np.testing.assert_array_equal(labels[row], row_labels)


def test_labels_are_nearest_centroids():
    values = np.random.default_rng(3).laplace(size=5000).astype(np.float32)
    centroids, labels = kmeans1d(values, 8)
    nearest = np.argmin(np.abs(values[:, None] - centroids[None, :]), axis=1)
    chosen = np.abs(values - centroids[labels])
    np.testing.assert_allclose(chosen, np.abs(values - centroids[nearest]), atol=1e-6)


def test_rejects_nan():
    with pytest.raises(ValueError, match="NaN"):
        kmeans1d(np.array([1.0, np.nan, 2.0]), 2)


def _exact_mse(row, k):
    """Optimal k-means MSE of one row, from coremltools' exact 1-D solver (an outside reference)."""
    values, inverse, counts = np.unique(row, return_inverse=True, return_counts=True)
    found = _kmeans1d.cluster(values.astype(np.float64), k, weights=counts.astype(np.float64))
    centroids = np.array(found.centroids)[np.array(found.clusters)]
    return float(np.mean((row.astype(np.float64) - centroids[inverse.ravel()]) ** 2))


@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("nbits, allowed", [(2, 1.0005), (4, 1.002), (6, 1.06)])
def test_float16_rows_close_to_the_exact_optimum(rows, nbits, allowed):
    rng = np.random.default_rng(5)
    matrix = (rng.laplace(size=(rows, 8192)) / 40).astype(np.float16)
    luts, labels = palettize_groups(matrix, 1 << nbits, lut_dtype=np.float16)
    assert luts.dtype == np.float64 and np.array_equal(luts, luts.astype(np.float16))
    ours = np.mean([_mse(matrix[r].astype(np.float64), luts[r], labels[r]) for r in range(rows)])
    exact = np.mean([_exact_mse(matrix[r], 1 << nbits) for r in range(rows)])
    assert ours <= exact * allowed


@pytest.mark.parametrize("rows", [1, 5])
def test_float16_labels_are_nearest_stored_entries(rows):
    matrix = np.random.default_rng(9).standard_normal((rows, 3000)).astype(np.float16)
    luts, labels = palettize_groups(matrix, 16, lut_dtype=np.float16)
    for row in range(rows):
        values = matrix[row].astype(np.float64)
        distance = np.abs(values[:, None] - luts[row][None, :])
        np.testing.assert_array_equal(distance[np.arange(values.size), labels[row]], distance.min(axis=1))


@pytest.mark.parametrize("rows", [1, 3])
def test_float16_nan_and_infinity_are_rejected(rows):
    matrix = np.zeros((rows, 100), dtype=np.float16)
    matrix[-1, 7] = np.inf
    with pytest.raises(ValueError, match="NaN or infinity"):
        palettize_groups(matrix, 4)


def test_float16_tensors_clustered_together_are_near_the_exact_optimum():
    """Tensors of different sizes and spreads share one batched call; each keeps its own table."""
    from edgebuild_coreml.compress.kmeans1d import palettize_fp16_tensors

    rng = np.random.default_rng(11)
    tensors = [
        (rng.standard_normal(40_000) / 45).astype(np.float16),
        (rng.laplace(size=12_345) / 3).astype(np.float16),
        rng.integers(-3, 4, size=20_000).astype(np.float16),  # 7 distinct values for 16 entries
    ]
    luts, tables = palettize_fp16_tensors([t.view(np.uint16) for t in tensors], 16, rows_per_call=2)
    for tensor, lut, table in zip(tensors, luts, tables):
        labels = table[tensor.view(np.uint16)]
        values = tensor.astype(np.float64)
        assert np.array_equal(lut, lut.astype(np.float16)) and np.all(np.diff(lut) >= 0)
        distance = np.abs(values[:, None] - lut[None, :])
        np.testing.assert_array_equal(distance[np.arange(values.size), labels], distance.min(axis=1))
        assert _mse(values, lut, labels) <= _exact_mse(tensor, 16) * 1.002


def test_float16_histogram_of_many_rows_matches_unique():
    from edgebuild_coreml.compress.fp16_histogram import FP16Histogram

    rng = np.random.default_rng(4)
    matrix = (rng.standard_normal((6, 3000)) / 30).astype(np.float16)
    matrix[2, :1500] = 0.5  # rows of very different variety
    matrix[4, 7] = -0.0  # -0 and +0 are one value
    histogram = FP16Histogram(matrix)
    for row in range(matrix.shape[0]):
        values, counts = np.unique(matrix[row].astype(np.float64), return_counts=True)
        kept = histogram.counts[row] > 0
        np.testing.assert_array_equal(histogram.values[row][kept], values)
        np.testing.assert_array_equal(histogram.counts[row][kept], counts)
        assert np.all(np.diff(histogram.values[row]) >= 0)
