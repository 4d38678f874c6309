"""Fast, near-optimal 1-D k-means for palettising scalar weights.

In one dimension an optimal k-means partition is a set of contiguous runs of the sorted
values, so clustering reduces to choosing k-1 cut points in a sorted array. With prefix sums
of w, w*x and w*x^2 the cost of any run is O(1), which makes two things cheap:

* a seed from an exact dynamic programme restricted to a coarse grid of candidate cuts
  (weighted quantiles plus evenly spaced values), O(k * G^2) with G around 128 — exact when
  the input has no more than G values;
* Lloyd iterations that only move the cuts: centroids are run means, the new cuts are the
  midpoints between neighbouring centroids, located by binary search in the sorted values.

Rows of a 2-D matrix (grouped channels) are sorted with one ``np.sort(axis=1)`` call and the
grid programme runs on all rows at once; chunks of rows go to a thread pool (numpy releases
the GIL in sorts and large element-wise kernels).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

# Cuts on the seeding grid (at least 2k); the programme costs k * grid^2 per row.
_GRID_SIZE = 128
_MAX_LLOYD_ITERATIONS = 300
# Rows per work item: at most 32, and the [rows, grid, grid] matrices stay near 16 MB.
_ROWS_PER_CHUNK = 32
_PROGRAMME_CELLS_PER_CHUNK = 1 << 21


def kmeans1d(
    values: np.ndarray, k: int, *, weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Cluster scalar ``values`` (any shape) into ``k`` centroids.

    Returns ``(centroids [k] ascending, labels)`` with labels shaped like ``values``.
    ``weights`` are optional non-negative sample weights of the same shape.
    """
    values = np.asarray(values)
    row_weights = None if weights is None else np.asarray(weights).reshape(1, -1)
    luts, labels = palettize_groups(values.reshape(1, -1), k, weights=row_weights)
    return luts[0], labels.reshape(values.shape)


def palettize_groups(
    matrix_2d: np.ndarray,
    k: int,
    *,
    weights: np.ndarray | None = None,
    workers: int | None = None,
    lut_dtype: np.dtype | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Cluster each row of ``matrix_2d`` independently into ``k`` centroids.

    Returns ``(luts [rows, k] ascending float64, labels [rows, n])``; labels are uint8 when
    ``k <= 256``. ``workers`` defaults to the number of CPUs. With ``lut_dtype`` (e.g. the
    weight's float16) centroids are rounded to it before labelling, so each label is the
    nearest entry of the table that will actually be stored.
    """
    matrix = np.asarray(matrix_2d)
    if matrix.ndim != 2 or matrix.shape[1] == 0:
        raise ValueError(f"palettize_groups needs a non-empty 2-D matrix, got shape {matrix.shape}")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if not np.all(np.isfinite(matrix)):
        raise ValueError("cannot cluster weights containing NaN or infinity")
    if weights is not None:
        weights = np.broadcast_to(np.asarray(weights, dtype=np.float64), matrix.shape)
        if np.any(weights < 0):
            raise ValueError("sample weights must be non-negative")

    rows = matrix.shape[0]
    grid_cells = (max(_GRID_SIZE, min(4 * k, 2 * _GRID_SIZE), 2 * k) + 1) ** 2
    step = max(1, min(_ROWS_PER_CHUNK, _PROGRAMME_CELLS_PER_CHUNK // grid_cells))
    bounds = [(start, min(start + step, rows)) for start in range(0, rows, step)]
    luts = np.empty((rows, k), dtype=np.float64)
    labels = np.empty(matrix.shape, dtype=np.uint8 if k <= 256 else np.intp)

    def run(bound: tuple[int, int]) -> None:
        start, stop = bound
        chunk_weights = None if weights is None else weights[start:stop]
        luts[start:stop], labels[start:stop] = _cluster_rows(
            matrix[start:stop], k, chunk_weights, lut_dtype
        )

    workers = workers or os.cpu_count() or 1
    if workers == 1 or len(bounds) == 1:
        for bound in bounds:
            run(bound)
    else:
        with ThreadPoolExecutor(max_workers=min(workers, len(bounds))) as pool:
            list(pool.map(run, bounds))
    return luts, labels


def _cluster_rows(
    matrix: np.ndarray, k: int, weights: np.ndarray | None, lut_dtype: np.dtype | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Cluster a chunk of rows; the heart of the algorithm (see the module docstring)."""
    # float16 sorts slowly and accumulates badly; float32 sorts fast and is exact for it.
    work_dtype = np.float32 if matrix.dtype in (np.float16, np.float32) else np.float64
    values = matrix.astype(work_dtype, copy=False)
    if weights is None:
        sorted_values = np.sort(values, axis=1)
        sorted_weights = np.ones(sorted_values.shape)
    else:
        order = np.argsort(values, axis=1)
        sorted_values = np.take_along_axis(values, order, axis=1)
        sorted_weights = np.take_along_axis(weights, order, axis=1)
    sorted_values, sorted_weights = _collapse_duplicates(sorted_values, sorted_weights)

    # Centre each row so the prefix sums of x^2 do not swamp run variances.
    offset = (sorted_values[:, :1].astype(np.float64) + sorted_values[:, -1:]) / 2
    prefix = _PrefixSums(sorted_values.astype(np.float64) - offset, sorted_weights)

    cuts = _seed_cuts(sorted_values, prefix, k)
    cuts, centroids = _lloyd_on_cuts(sorted_values, prefix, cuts, offset)
    if lut_dtype is not None:  # rounding is monotonic, so the table stays ascending
        centroids = centroids.astype(lut_dtype).astype(np.float64)

    midpoints = (centroids[:, :-1] + centroids[:, 1:]) / 2
    labels = _searchsorted_rows(midpoints.astype(work_dtype), values, side="right")
    return centroids, labels


def _collapse_duplicates(
    sorted_values: np.ndarray, sorted_weights: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Replace runs of equal values by one value carrying their total weight.

    float16 weights have at most 63,488 finite values, so a tensor of millions collapses to a
    few tens of thousands and every later step gets that much cheaper. Rows are padded with
    their last value at weight 0, which keeps them sorted and changes no sum.
    """
    rows, n = sorted_values.shape
    starts_per_row = []
    for row in range(rows):
        is_start = np.empty(n, dtype=bool)
        is_start[0] = True
        np.not_equal(sorted_values[row, 1:], sorted_values[row, :-1], out=is_start[1:])
        starts_per_row.append(np.flatnonzero(is_start))
    width = max(len(starts) for starts in starts_per_row)
    if width > n // 2:
        return sorted_values, sorted_weights
    unique = np.empty((rows, width), dtype=sorted_values.dtype)
    totals = np.zeros((rows, width))
    for row, starts in enumerate(starts_per_row):
        unique[row, : len(starts)] = sorted_values[row, starts]
        unique[row, len(starts) :] = sorted_values[row, -1]
        totals[row, : len(starts)] = np.add.reduceat(sorted_weights[row], starts)
    return unique, totals


class _PrefixSums:
    """Cumulative weight, weighted sum and weighted square sum of sorted rows, with a leading 0."""

    def __init__(self, centred: np.ndarray, w: np.ndarray):
        rows = centred.shape[0]
        zero = np.zeros((rows, 1))
        self.weight = np.concatenate([zero, np.cumsum(w, axis=1)], axis=1)
        self.first = np.concatenate([zero, np.cumsum(w * centred, axis=1)], axis=1)
        self.second = np.concatenate([zero, np.cumsum(w * centred * centred, axis=1)], axis=1)

    def runs(self, starts: np.ndarray, stops: np.ndarray) -> tuple[np.ndarray, ...]:
        """Weight, sum and square sum of runs [start, stop) per row (broadcasting index arrays)."""

        def between(prefix: np.ndarray) -> np.ndarray:
            return _take_rows(prefix, stops) - _take_rows(prefix, starts)

        return between(self.weight), between(self.first), between(self.second)


def _take_rows(prefix: np.ndarray, index: np.ndarray) -> np.ndarray:
    rows = np.arange(prefix.shape[0]).reshape((-1,) + (1,) * (index.ndim - 1))
    return prefix[rows, index]


def _run_cost(weight: np.ndarray, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Sum of squared deviations from the run mean; 0 for empty runs."""
    with np.errstate(divide="ignore", invalid="ignore"):
        cost = second - np.where(weight > 0, first * first / weight, 0.0)
    return np.maximum(cost, 0.0)


def _candidate_cuts(sorted_values: np.ndarray, prefix: _PrefixSums, k: int) -> np.ndarray:
    """Grid of cut positions per row: weighted quantiles plus evenly spaced values, sorted."""
    rows, n = sorted_values.shape
    grid_size = max(_GRID_SIZE, min(4 * k, 2 * _GRID_SIZE), 2 * k)
    if n <= grid_size:
        return np.broadcast_to(np.arange(n + 1), (rows, n + 1)).copy()
    half = grid_size // 2
    fractions = np.linspace(0.0, 1.0, half + 1)
    total = prefix.weight[:, -1:]
    by_weight = _searchsorted_rows(prefix.weight[:, 1:], total * fractions, side="left")
    low, high = sorted_values[:, :1], sorted_values[:, -1:]
    by_value = _searchsorted_rows(
        sorted_values, (low + (high - low) * fractions).astype(sorted_values.dtype), side="left"
    )
    grid = np.concatenate([by_weight, by_value, np.zeros((rows, 1), np.intp)], axis=1)
    grid = np.minimum(grid, n)
    grid[:, -1] = n
    return np.sort(grid, axis=1)


def _seed_cuts(sorted_values: np.ndarray, prefix: _PrefixSums, k: int) -> np.ndarray:
    """k+1 cut positions per row (first 0, last n) from the grid programme."""
    rows, n = sorted_values.shape
    grid = _candidate_cuts(sorted_values, prefix, k)
    if k == 1:
        return np.stack([np.zeros(rows, np.intp), np.full(rows, n)], axis=1)
    size = grid.shape[1]
    starts, stops = grid[:, :, None], grid[:, None, :]
    run_cost = _run_cost(*prefix.runs(np.minimum(starts, stops), stops))
    run_cost[:, np.tri(size, k=-1, dtype=bool)] = np.inf  # a run cannot end before it starts

    # best[r, j]: least cost of covering [0, grid[j]) with m runs; choice[m][r, j]: last cut.
    best = run_cost[:, 0, :]
    choices = []
    for _ in range(k - 1):
        total = best[:, :, None] + run_cost
        choice = np.argmin(total, axis=1)
        best = np.take_along_axis(total, choice[:, None, :], axis=1)[:, 0, :]
        choices.append(choice)

    cut_index = np.full(rows, size - 1)
    cuts = [grid[np.arange(rows), cut_index]]
    for choice in reversed(choices):
        cut_index = choice[np.arange(rows), cut_index]
        cuts.append(grid[np.arange(rows), cut_index])
    cuts.append(np.zeros(rows, np.intp))
    return np.stack(cuts[::-1], axis=1)


def _lloyd_on_cuts(
    sorted_values: np.ndarray, prefix: _PrefixSums, cuts: np.ndarray, offset: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Move cuts to the midpoints of their run means until none moves; return cuts, centroids."""
    for _ in range(_MAX_LLOYD_ITERATIONS):
        centroids = _run_means(sorted_values, prefix, cuts, offset)
        midpoints = (centroids[:, :-1] + centroids[:, 1:]) / 2
        inner = _searchsorted_rows(
            sorted_values, midpoints.astype(sorted_values.dtype), side="left"
        )
        if np.array_equal(inner, cuts[:, 1:-1]):
            return cuts, centroids
        cuts = cuts.copy()
        cuts[:, 1:-1] = inner
    return cuts, _run_means(sorted_values, prefix, cuts, offset)


def _run_means(
    sorted_values: np.ndarray, prefix: _PrefixSums, cuts: np.ndarray, offset: np.ndarray
) -> np.ndarray:
    """Mean of each run; an empty run takes the value at its cut so centroids stay ascending."""
    weight, first, _ = prefix.runs(cuts[:, :-1], cuts[:, 1:])
    n = sorted_values.shape[1]
    at_cut = _take_rows(sorted_values, np.minimum(cuts[:, :-1], n - 1)).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        means = np.where(weight > 0, first / weight + offset, at_cut)
    # Rounding can break ties in order by an ulp; centroids must stay sorted for midpoints.
    return np.maximum.accumulate(means, axis=1)


def _searchsorted_rows(sorted_rows: np.ndarray, queries: np.ndarray, side: str) -> np.ndarray:
    """np.searchsorted applied row by row (rows of ``sorted_rows`` against rows of ``queries``)."""
    out = np.empty(queries.shape, dtype=np.intp)
    for row in range(queries.shape[0]):
        out[row] = np.searchsorted(sorted_rows[row], queries[row], side=side)
    return out
