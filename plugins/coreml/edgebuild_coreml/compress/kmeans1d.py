"""Fast, near-optimal 1-D k-means for palettising scalar weights.

In one dimension an optimal k-means partition is a set of contiguous runs of the sorted
values, so clustering reduces to choosing k-1 cut points in a sorted array. With prefix sums
of w, w*x and w*x^2 the cost of any run is O(1), which makes three steps cheap:

* a seed: an exact dynamic programme restricted to a coarse grid of candidate cuts
  (weighted quantiles plus evenly spaced values), O(k * G^2) with G = max(32, 4k) and exact
  when the input has no more than G distinct values; for k > 16, cuts spacing the centroids
  by density^(1/3), the optimal spacing for many centroids;
* Lloyd iterations that only move the cuts: centroids are run means, the new cuts are the
  midpoints between neighbouring centroids, located by binary search in the sorted values;
* polishing: an exact programme over a band of positions around the current cuts, which
  moves several cuts at once out of the local optima Lloyd stops in, then Lloyd again.

Rows of a 2-D matrix (channel groups) are clustered together: every step above is one numpy
call over all rows, revisiting only rows that still change. float16 rows never need a float
sort: ``fp16_histogram`` turns them into weighted distinct values (at most 63,487) and
labels them with a table look-up; very large rows of other dtypes go through their float16
roundings. Chunks of rows go to a thread pool (numpy releases the GIL in its large kernels).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from edgebuild.plugin import cpu_threads

from . import fp16_histogram
from .sorted_runs import collapse_sorted_rows

NOT_FINITE = "cannot cluster weights containing NaN or infinity"
# Rows of other dtypes at least this big are clustered through their float16 roundings.
_APPROXIMATE_FROM = 1 << 20
_FP16_MAX = 65504.0
_MAX_LLOYD_ITERATIONS = 40
# Polishing rounds: an exact programme over cut positions at these offsets from the current
# ones (fine steps near, coarse steps far, so several cuts can move a long way together).
_MAX_POLISH_ROUNDS = 4
_STEPS = np.array([1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233])
_BAND_OFFSETS = np.concatenate([-_STEPS[::-1], [0], _STEPS])
_MAX_PROGRAMME_K = 16  # above this the grid programme costs more than it gains
# Rows per work item: the [rows, grid, grid] programme matrices stay near 16 MB.
_PROGRAMME_CELLS_PER_CHUNK = 1 << 21
_MAX_ROWS_PER_CHUNK = 256


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
    if weights is not None:
        weights = np.broadcast_to(np.asarray(weights, dtype=np.float64), matrix.shape)
        if np.any(weights < 0):
            raise ValueError("sample weights must be non-negative")

    rows = matrix.shape[0]
    grid = _grid_size(k) + 1
    cells = grid * grid if k <= _MAX_PROGRAMME_K else 1
    step = max(1, min(_MAX_ROWS_PER_CHUNK, _PROGRAMME_CELLS_PER_CHUNK // cells))
    bounds = [(start, min(start + step, rows)) for start in range(0, rows, step)]
    luts = np.empty((rows, k), dtype=np.float64)
    labels = np.empty(matrix.shape, dtype=np.uint8 if k <= 256 else np.intp)

    def run(bound: tuple[int, int]) -> None:
        start, stop = bound
        chunk_weights = None if weights is None else weights[start:stop]
        luts[start:stop], labels[start:stop] = _cluster_rows(
            matrix[start:stop], k, chunk_weights, lut_dtype
        )

    workers = workers or cpu_threads()
    if workers == 1 or len(bounds) == 1:
        for bound in bounds:
            run(bound)
    else:
        with ThreadPoolExecutor(max_workers=min(workers, len(bounds))) as pool:
            list(pool.map(run, bounds))
    return luts, labels


def palettize_fp16_tensors(
    patterns: list[np.ndarray], k: int, *, rows_per_call: int = 32
) -> tuple[np.ndarray, np.ndarray]:
    """One table per float16 tensor, for many tensors at once.

    ``patterns`` are the tensors' flat uint16 views. Returns ``(luts [tensors, k] ascending,
    float64 values of float16, label_tables [tensors, 65536] uint8)``: a tensor's labels are
    ``label_tables[t][patterns[t]]``, each the nearest entry of its stored table. Histograms
    make each tensor at most 63,487 weighted points, so tensors are clustered as rows of one
    matrix (a few numpy calls for all of them instead of per tensor).
    """
    if k > 256:
        raise ValueError(f"at most 256 entries per table, got {k}")
    counts = [fp16_histogram.count_patterns(p) for p in patterns]
    luts = np.empty((len(patterns), k))
    tables = np.empty((len(patterns), 1 << 16), dtype=np.uint8)
    # Rows of a call are padded to the widest; group tensors of similar variety together.
    by_variety = sorted(range(len(patterns)), key=lambda t: np.count_nonzero(counts[t]))
    for start in range(0, len(by_variety), rows_per_call):
        chosen = by_variety[start : start + rows_per_call]
        values, weights = fp16_histogram.points_from_pattern_counts(np.stack([counts[t] for t in chosen]))
        centroids = cluster_sorted(values, weights, k, np.float16)
        luts[chosen] = centroids
        tables[chosen] = fp16_histogram.label_of_pattern(_midpoints(centroids))
    return luts, tables


def _cluster_rows(
    matrix: np.ndarray, k: int, weights: np.ndarray | None, lut_dtype: np.dtype | None
) -> tuple[np.ndarray, np.ndarray]:
    """Cluster a chunk of rows: weighted sorted points, cuts, centroids, then labels."""
    if matrix.dtype == np.float16 and weights is None:
        histogram = fp16_histogram.FP16Histogram(matrix)  # checks finiteness on the way
        centroids = cluster_sorted(histogram.values, histogram.counts, k, lut_dtype)
        return centroids, histogram.labels(_midpoints(centroids))
    if not np.all(np.isfinite(matrix)):
        raise ValueError(NOT_FINITE)
    if weights is None and matrix.size >= _APPROXIMATE_FROM and np.abs(matrix).max() < _FP16_MAX:
        return _cluster_through_float16(matrix, k, lut_dtype)

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
    points, point_weights = _collapse_duplicates(sorted_values, sorted_weights)
    centroids = cluster_sorted(points.astype(np.float64), point_weights, k, lut_dtype)
    midpoints = _midpoints(centroids).astype(work_dtype)
    labels = searchsorted_rows(midpoints, values, side="right")
    return centroids, labels.astype(np.uint8 if k <= 256 else np.intp, copy=False)


def _cluster_through_float16(
    matrix: np.ndarray, k: int, lut_dtype: np.dtype | None
) -> tuple[np.ndarray, np.ndarray]:
    """Big float32/64 rows: cluster their float16 roundings, then fit centroids to the originals.

    Sorting millions of floats dominates otherwise. Rounding to float16 moves a weight by
    at most 2^-11 of itself, so the partition found is a near-optimal one for the originals;
    each centroid then becomes the exact mean of its members (one Lloyd step on the real data).
    """
    rounded = matrix.astype(np.float16)
    histogram = fp16_histogram.FP16Histogram(rounded)
    approximate = cluster_sorted(histogram.values, histogram.counts, k)
    labels = histogram.labels(_midpoints(approximate))
    centroids = np.empty_like(approximate)
    for row in range(matrix.shape[0]):
        counts = np.bincount(labels[row], minlength=k)
        sums = np.bincount(labels[row], weights=matrix[row], minlength=k)
        centroids[row] = np.where(counts > 0, sums / np.maximum(counts, 1), approximate[row])
    centroids = np.maximum.accumulate(centroids, axis=1)
    if lut_dtype is not None:
        centroids = centroids.astype(lut_dtype).astype(np.float64)
    return centroids, labels


def cluster_sorted(
    points: np.ndarray, weights: np.ndarray, k: int, lut_dtype: np.dtype | None = None
) -> np.ndarray:
    """Centroids [rows, k] (ascending) of weighted points [rows, n] sorted along each row."""
    # Centre each row so the prefix sums of x^2 do not swamp run variances.
    offset = (points[:, :1] + points[:, -1:]) / 2
    prefix = _PrefixSums(points - offset, weights)
    search = RowSearch(points)
    cuts = _seed_cuts(points, prefix, k)
    active = np.arange(points.shape[0])
    centroids = _lloyd_on_cuts(points, prefix, cuts, offset, search, active)
    for _ in range(_MAX_POLISH_ROUNDS if k > 1 else 0):
        polished = _band_programme(prefix, cuts[active], active)
        changed = np.any(polished != cuts[active], axis=1)
        active = active[changed]
        if not active.size:
            break
        cuts[active] = polished[changed]
        centroids[active] = _lloyd_on_cuts(points, prefix, cuts, offset, search, active)
    if lut_dtype is not None:  # rounding is monotonic, so the table stays ascending
        centroids = centroids.astype(lut_dtype).astype(np.float64)
    return centroids


def _midpoints(centroids: np.ndarray) -> np.ndarray:
    return (centroids[:, :-1] + centroids[:, 1:]) / 2


def _grid_size(k: int) -> int:
    return max(32, 4 * k)


def _collapse_duplicates(
    sorted_values: np.ndarray, sorted_weights: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Equal values merged into one point carrying their total weight, if that halves the work."""
    n = sorted_values.shape[1]
    distinct = 1 + np.count_nonzero(sorted_values[:, 1:] != sorted_values[:, :-1], axis=1)
    if int(distinct.max()) > n // 2:
        return sorted_values, sorted_weights
    return collapse_sorted_rows(sorted_values, sorted_weights)


class _PrefixSums:
    """Cumulative weight, weighted sum and weighted square sum of sorted rows, with a leading 0."""

    def __init__(self, centred: np.ndarray, w: np.ndarray):
        rows = centred.shape[0]
        zero = np.zeros((rows, 1))
        self.weight = np.concatenate([zero, np.cumsum(w, axis=1)], axis=1)
        self.first = np.concatenate([zero, np.cumsum(w * centred, axis=1)], axis=1)
        self.second = np.concatenate([zero, np.cumsum(w * centred * centred, axis=1)], axis=1)

    def sums_at(self, index: np.ndarray, rows: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        """The three prefix sums at positions ``index`` [len(rows), ...]."""
        return tuple(_take_rows(p, index, rows) for p in (self.weight, self.first, self.second))

    def runs(
        self, starts: np.ndarray, stops: np.ndarray, rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, ...]:
        """Weight, sum and square sum of runs [start, stop) per row (broadcasting index arrays).

        ``rows`` selects which rows the index arrays belong to (default: all, in order).
        """

        def between(prefix: np.ndarray) -> np.ndarray:
            return _take_rows(prefix, stops, rows) - _take_rows(prefix, starts, rows)

        return between(self.weight), between(self.first), between(self.second)


def _take_rows(prefix: np.ndarray, index: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    if rows is None:
        rows = np.arange(prefix.shape[0])
    return prefix[rows.reshape((-1,) + (1,) * (index.ndim - 1)), index]


def _pair_costs(at_starts: tuple, at_stops: tuple) -> np.ndarray:
    """Cost of every run from a start [..., a] to a stop [..., b] as [..., a, b]; inf if reversed.

    Arguments are ``sums_at`` results: gathering once per position and broadcasting the
    differences is far cheaper than gathering once per pair.
    """
    between = [stop[..., None, :] - start[..., :, None] for start, stop in zip(at_starts, at_stops)]
    cost = _run_cost(*between)
    return np.where(between[0] >= 0, cost, np.inf)


def _run_cost(weight: np.ndarray, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Sum of squared deviations from the run mean; 0 for empty runs."""
    with np.errstate(divide="ignore", invalid="ignore"):
        cost = second - np.where(weight > 0, first * first / weight, 0.0)
    return np.maximum(cost, 0.0)


def _candidate_cuts(sorted_values: np.ndarray, prefix: _PrefixSums, k: int) -> np.ndarray:
    """Grid of cut positions per row: weighted quantiles plus evenly spaced values, sorted."""
    rows, n = sorted_values.shape
    grid_size = _grid_size(k)
    if n <= grid_size:
        return np.broadcast_to(np.arange(n + 1), (rows, n + 1)).copy()
    half = grid_size // 2
    fractions = np.linspace(0.0, 1.0, half + 1)
    total = prefix.weight[:, -1:]
    by_weight = searchsorted_rows(prefix.weight[:, 1:], total * fractions, side="left")
    low, high = sorted_values[:, :1], sorted_values[:, -1:]
    by_value = searchsorted_rows(sorted_values, low + (high - low) * fractions, side="left")
    grid = np.concatenate([by_weight, by_value, np.zeros((rows, 1), np.intp)], axis=1)
    grid = np.minimum(grid, n)
    grid[:, -1] = n
    return np.sort(grid, axis=1)


def _seed_cuts(sorted_values: np.ndarray, prefix: _PrefixSums, k: int) -> np.ndarray:
    """k+1 cut positions per row (first 0, last n)."""
    rows, n = sorted_values.shape
    if k == 1:
        return np.stack([np.zeros(rows, np.intp), np.full(rows, n)], axis=1)
    if k > _MAX_PROGRAMME_K:
        return _companding_cuts(sorted_values, prefix.weight, k)
    return _programme_cuts(sorted_values, prefix, k)


def _companding_cuts(sorted_values: np.ndarray, cumulative_weight: np.ndarray, k: int) -> np.ndarray:
    """Cuts spreading centroids with density proportional to the data density^(1/3).

    That is the optimal spacing of many centroids for squared error (Panter and Dite), so
    Lloyd starts close to its answer instead of crawling there from plain quantiles. The
    density comes from 4k equal-weight bins: sparse tails then still get a density (an
    equal-width histogram would leave them empty, and the cube root of a sparse histogram
    under-weights them badly).
    """
    rows, n = sorted_values.shape
    bins = 4 * k
    total = cumulative_weight[:, -1:]
    positions = searchsorted_rows(cumulative_weight[:, 1:], total * (np.arange(bins + 1) / bins), side="left")
    edges = _take_rows(sorted_values, np.minimum(positions, n - 1))
    edges[:, 0], edges[:, -1] = sorted_values[:, 0], sorted_values[:, -1]
    width = np.diff(edges, axis=1)
    mass = np.diff(_take_rows(cumulative_weight, np.minimum(positions, n)), axis=1)
    measure = np.concatenate(
        [np.zeros((rows, 1)), np.cumsum(np.cbrt(mass) * np.cbrt(width) ** 2, axis=1)], axis=1
    )
    levels = measure[:, -1:] * (np.arange(1, k) / k)
    # Interpolate each level inside its bin, then find the cut among the sorted values.
    bin_of = np.clip(searchsorted_rows(measure, levels, side="left") - 1, 0, bins - 1)
    below, above = _take_rows(measure, bin_of), _take_rows(measure, bin_of + 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        inside = np.where(above > below, (levels - below) / (above - below), 0.5)
    cut_values = _take_rows(edges, bin_of) + _take_rows(width, bin_of) * inside
    inner = searchsorted_rows(sorted_values, cut_values, side="left")
    cuts = np.concatenate([np.zeros((rows, 1), np.intp), inner, np.full((rows, 1), n)], axis=1)
    return np.maximum.accumulate(cuts, axis=1)


def _programme_cuts(sorted_values: np.ndarray, prefix: _PrefixSums, k: int) -> np.ndarray:
    """The exact least-cost k runs whose boundaries lie on the candidate grid."""
    rows = sorted_values.shape[0]
    grid = _candidate_cuts(sorted_values, prefix, k)
    size = grid.shape[1]
    at_grid = prefix.sums_at(grid)
    run_cost = _pair_costs(at_grid, at_grid)
    run_cost[:, np.tri(size, k=-1, dtype=bool)] = np.inf  # a run cannot end before it starts

    # best[r, j]: least cost of covering [0, grid[j]) with m runs; choice[m][r, j]: last cut.
    best = run_cost[:, 0, :]
    choices = []
    for _ in range(k - 1):
        total = best[:, :, None] + run_cost
        choice = np.argmin(total, axis=1)
        best = np.take_along_axis(total, choice[:, None, :], axis=1)[:, 0, :]
        choices.append(choice)

    every_row = np.arange(rows)
    cut_index = np.full(rows, size - 1)
    cuts = [grid[every_row, cut_index]]
    for choice in reversed(choices):
        cut_index = choice[every_row, cut_index]
        cuts.append(grid[every_row, cut_index])
    cuts.append(np.zeros(rows, np.intp))
    return np.stack(cuts[::-1], axis=1)


def _lloyd_on_cuts(
    sorted_values: np.ndarray,
    prefix: _PrefixSums,
    cuts: np.ndarray,
    offset: np.ndarray,
    search: RowSearch,
    rows: np.ndarray,
) -> np.ndarray:
    """Move the cuts of ``rows`` (in place) to the midpoints of their run means until none
    moves; return those rows' centroids.

    Rows converge at different speeds (a few take ten times as long as most), so each
    iteration only revisits the rows whose cuts moved in the previous one.
    """
    centroids = np.empty((rows.size, cuts.shape[1] - 1))
    centroids[:] = _run_means(sorted_values, prefix, cuts[rows], offset, rows)
    active = np.arange(rows.size)  # positions within ``rows``
    for _ in range(_MAX_LLOYD_ITERATIONS):
        inner = search(_midpoints(centroids[active]), side="left", rows=rows[active])
        moved = np.any(inner != cuts[rows[active], 1:-1], axis=1)
        if not moved.any():
            break
        active = active[moved]
        cuts[rows[active], 1:-1] = inner[moved]
        centroids[active] = _run_means(sorted_values, prefix, cuts[rows[active]], offset, rows[active])
    return centroids


def _band_programme(prefix: _PrefixSums, cuts: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The least-cost cuts of ``rows`` when each inner cut may move by one of ``_BAND_OFFSETS``.

    Lloyd stops where no single cut wants to move, which on discrete data (float16 weights,
    many centroids) can be well short of the optimum; an exact programme over a band of
    positions moves several cuts together and never raises the cost (the current cuts are
    among its choices).
    """
    count, k_plus_1 = cuts.shape
    n = prefix.weight.shape[1] - 1
    candidates = np.clip(cuts[:, :, None] + _BAND_OFFSETS, 0, n)  # [rows, k+1, band]
    candidates[:, 0, :], candidates[:, -1, :] = 0, n
    at = prefix.sums_at(candidates, rows)

    def layer_sums(layer: int) -> tuple:
        return tuple(sums[:, layer, :] for sums in at)

    best = _pair_costs(layer_sums(0), layer_sums(1))[:, 0, :]  # layer 0 is all position 0
    choices = []
    for layer in range(2, k_plus_1):
        total = best[:, :, None] + _pair_costs(layer_sums(layer - 1), layer_sums(layer))
        choice = np.argmin(total, axis=1)
        best = np.take_along_axis(total, choice[:, None, :], axis=1)[:, 0, :]
        choices.append(choice)

    every = np.arange(count)
    picked = np.zeros((count, k_plus_1), dtype=np.intp)
    picked[:, -1] = n
    index = np.zeros(count, dtype=np.intp)  # every candidate of the last layer is n
    for layer, choice in zip(range(k_plus_1 - 2, 0, -1), reversed(choices)):
        index = choice[every, index]
        picked[:, layer] = candidates[every, layer, index]
    # Keep the current cuts wherever the programme found nothing clearly better.
    current = _total_cost(prefix, cuts, rows)
    return np.where((best[:, 0] < current * (1 - 1e-12))[:, None], picked, cuts)


def _total_cost(prefix: _PrefixSums, cuts: np.ndarray, rows: np.ndarray) -> np.ndarray:
    return _run_cost(*prefix.runs(cuts[:, :-1], cuts[:, 1:], rows)).sum(axis=1)


def _run_means(
    sorted_values: np.ndarray,
    prefix: _PrefixSums,
    cuts: np.ndarray,
    offset: np.ndarray,
    rows: np.ndarray | None = None,
) -> np.ndarray:
    """Mean of each run; an empty run takes the value at its cut so centroids stay ascending."""
    if rows is None:
        rows = np.arange(sorted_values.shape[0])
    weight, first, _ = prefix.runs(cuts[:, :-1], cuts[:, 1:], rows)
    n = sorted_values.shape[1]
    at_cut = _take_rows(sorted_values, np.minimum(cuts[:, :-1], n - 1), rows).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        means = np.where(weight > 0, first / weight + offset[rows], at_cut)
    # Rounding can break ties in order by an ulp; centroids must stay sorted for midpoints.
    return np.maximum.accumulate(means, axis=1)


class RowSearch:
    """``np.searchsorted`` of each row of queries in the same row of ``sorted_rows``, at once.

    Rows are laid end to end on one axis, each shifted past the previous one's range, so one
    binary search serves every row. Adding a shift is monotonic, so rounding can only turn a
    near-tie into a tie, never reorder a query and a value.
    """

    def __init__(self, sorted_rows: np.ndarray):
        rows, self.n = sorted_rows.shape
        low = sorted_rows[:, :1].astype(np.float64)
        span = float(np.max(sorted_rows[:, -1:] - low)) if rows > 1 else 0.0
        stride = 2.0 ** np.ceil(np.log2(span + 1.0)) * 2.0
        self.shift = np.arange(rows, dtype=np.float64)[:, None] * stride - low
        self.rows = rows
        self.flat = (sorted_rows + self.shift).reshape(-1) if rows > 1 else sorted_rows[0]

    def __call__(self, queries: np.ndarray, side: str, rows: np.ndarray | None = None) -> np.ndarray:
        """Positions of ``queries`` [len(rows), m] in their rows (``rows`` default: all)."""
        if self.rows == 1:
            return np.searchsorted(self.flat, queries, side=side)
        if rows is None:
            rows = np.arange(self.rows)
        shifted = queries + self.shift[rows]
        found = np.searchsorted(self.flat, shifted.reshape(-1), side=side).reshape(queries.shape)
        found -= rows[:, None] * self.n
        return np.clip(found, 0, self.n)


def searchsorted_rows(sorted_rows: np.ndarray, queries: np.ndarray, side: str) -> np.ndarray:
    """np.searchsorted applied row by row (rows of ``sorted_rows`` against rows of ``queries``)."""
    if sorted_rows.shape[1] > queries.shape[1] or sorted_rows.shape[0] == 1:
        return RowSearch(sorted_rows)(queries, side=side)
    out = np.empty(queries.shape, dtype=np.intp)  # few boundaries, many queries: one call a row
    for row in range(queries.shape[0]):
        out[row] = np.searchsorted(sorted_rows[row], queries[row], side=side)
    return out
