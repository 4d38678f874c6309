"""float16 rows as weighted distinct values, and labels by table look-up.

A float16 tensor holds at most 63,487 distinct finite values. Ranking all 65,536 bit
patterns by value once turns every later step into integer work: a histogram over the bit
patterns gives the distinct values and their counts without sorting floats (for many rows,
each row is counted against the values the whole matrix holds), and once the centroids are
known a row's labels come from a table indexed by bit pattern (or by position on that axis)
instead of a binary search per weight.
"""

from __future__ import annotations

import functools

import numpy as np



NOT_FINITE_RANK = 0xFFFF
# numpy widens 16-bit indices to intp before counting or gathering; in slices of this many
# elements the widened copy stays in cache, which halves the time of both.
_SLICE = 1 << 18
_NOT_FINITE = "cannot cluster weights containing NaN or infinity"


@functools.lru_cache(maxsize=1)
def _rank_tables() -> tuple[np.ndarray, np.ndarray]:
    """(distinct finite float16 values ascending as float64, rank of each 16-bit pattern).

    NaN and infinity patterns get rank ``NOT_FINITE_RANK``, above every real rank, so they
    sort last and are found without a separate pass over the weights.
    """
    patterns = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    values = patterns.view(np.float16).astype(np.float64)
    finite = np.isfinite(values)
    ordered = np.unique(values[finite])  # -0 and +0 become one value
    rank = np.full(1 << 16, NOT_FINITE_RANK, dtype=np.uint16)
    rank[finite] = np.searchsorted(ordered, values[finite])
    return ordered, rank


class FP16Histogram:
    """Distinct values and counts of each row of a finite float16 matrix [rows, n]."""

    def __init__(self, matrix: np.ndarray):
        ordered, rank_of_pattern = _rank_tables()
        self._patterns = np.ascontiguousarray(matrix).view(np.uint16)
        rows = self._patterns.shape[0]
        if rows == 1:
            self._axis_index = None
            self.values, self.counts = points_from_pattern_counts(count_patterns(self._patterns[0])[None, :])
        else:
            # One value axis for the whole matrix: the values it holds (far fewer than all
            # float16 values); each row is then counted against that axis in one bincount per row.
            self._axis = points_from_pattern_counts(count_patterns(self._patterns.reshape(-1))[None, :])[0][0]
            axis_index_of_rank = np.searchsorted(self._axis, ordered).astype(np.uint16)
            axis_index = axis_index_of_rank[np.minimum(rank_of_pattern, ordered.size - 1)]
            self._axis_index = _look_up(axis_index, self._patterns)
            counts = np.empty((rows, self._axis.size))
            for row in range(rows):
                counts[row] = np.bincount(self._axis_index[row], minlength=self._axis.size)
            self.values, self.counts = _compact_rows(counts, self._axis)

    def labels(self, midpoints: np.ndarray) -> np.ndarray:
        """Per weight, how many ``midpoints`` [rows, k-1] of its row lie at or below it."""
        if self._axis_index is None:
            return _look_up(label_of_pattern(midpoints)[0], self._patterns)
        table = _label_of_axis(midpoints, self._axis)
        out = np.empty(self._axis_index.shape, dtype=table.dtype)
        for row in range(out.shape[0]):
            np.take(table[row], self._axis_index[row], out=out[row])
        return out


def count_patterns(patterns: np.ndarray) -> np.ndarray:
    """``np.bincount`` of 16-bit patterns over all 65,536 values, a cache-sized slice at a time."""
    counts = np.zeros(1 << 16, dtype=np.int64)
    for start in range(0, patterns.size, _SLICE):
        counts += np.bincount(patterns[start : start + _SLICE], minlength=1 << 16)
    return counts


def points_from_pattern_counts(pattern_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted sorted points (values, counts) [rows, width] from per-row pattern counts [rows, 65536].

    Each row holds its present values ascending; shorter rows are padded with their largest
    value at count 0, which keeps them sorted and adds nothing to any sum.
    """
    ordered, rank_of_pattern = _rank_tables()
    not_finite = rank_of_pattern == NOT_FINITE_RANK
    if pattern_counts[:, not_finite].any():
        raise ValueError(_NOT_FINITE)
    patterns_by_rank, rank_starts = _patterns_by_rank()
    # -0 and +0 share a rank: sum the counts of each rank's patterns.
    by_rank = np.add.reduceat(pattern_counts[:, patterns_by_rank], rank_starts, axis=1)
    return _compact_rows(by_rank, ordered)


def _compact_rows(counts: np.ndarray, axis: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the ``axis`` values with a non-zero count, and those counts, left-aligned and
    padded with the row's largest value at count 0."""
    present = counts > 0
    distinct = present.sum(axis=1)
    if not distinct.all():
        raise ValueError("cannot cluster an empty row")
    values = np.empty((counts.shape[0], int(distinct.max())))
    weights = np.zeros(values.shape)
    for row, (mask, size) in enumerate(zip(present, distinct)):
        values[row, :size] = axis[mask]
        values[row, size:] = values[row, size - 1]
        weights[row, :size] = counts[row, mask]
    return values, weights


def label_of_pattern(midpoints: np.ndarray) -> np.ndarray:
    """[rows, 65536]: for each float16 bit pattern, how many of the row's midpoints lie at or
    below its value (non-finite patterns, never present, get the last label)."""
    ordered, rank_of_pattern = _rank_tables()
    return _label_of_rank(midpoints)[:, np.minimum(rank_of_pattern, ordered.size - 1)]


def _label_of_rank(midpoints: np.ndarray) -> np.ndarray:
    """[rows, distinct float16 values]: the label of each value, as ``labels`` counts them."""
    return _label_of_axis(midpoints, _rank_tables()[0])


def _label_of_axis(midpoints: np.ndarray, axis: np.ndarray) -> np.ndarray:
    """[rows, axis size]: per row, how many of its midpoints lie at or below each axis value."""
    rows, boundaries = midpoints.shape
    label_dtype = np.uint8 if boundaries < 256 else np.intp
    # Axis positions from first_above[r, j] on lie at or above midpoint j of row r.
    first_above = np.searchsorted(axis, midpoints, side="left")
    steps = np.zeros((rows, axis.size + 1), dtype=label_dtype)
    np.add.at(steps, (np.repeat(np.arange(rows), boundaries), first_above.reshape(-1)), 1)
    return np.cumsum(steps[:, :-1], axis=1, dtype=label_dtype)


@functools.lru_cache(maxsize=1)
def _patterns_by_rank() -> tuple[np.ndarray, np.ndarray]:
    """Finite patterns ordered by rank, and where each rank's run of patterns starts."""
    _, rank_of_pattern = _rank_tables()
    finite = np.flatnonzero(rank_of_pattern != NOT_FINITE_RANK)
    order = finite[np.argsort(rank_of_pattern[finite], kind="stable")]
    starts = np.flatnonzero(np.diff(rank_of_pattern[order], prepend=-1))
    return order, starts


def _look_up(table: np.ndarray, patterns: np.ndarray) -> np.ndarray:
    """``table[patterns]``, a cache-sized slice at a time."""
    flat_patterns = patterns.reshape(-1)
    out = np.empty(flat_patterns.size, dtype=table.dtype)
    for start in range(0, flat_patterns.size, _SLICE):
        stop = start + _SLICE
        np.take(table, flat_patterns[start:stop], out=out[start:stop])
    return out.reshape(patterns.shape)
