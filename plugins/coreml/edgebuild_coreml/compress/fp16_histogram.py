"""float16 rows as weighted distinct values, and labels by table look-up.

A float16 tensor holds at most 63,487 distinct finite values. Ranking all 65,536 bit
patterns by value once turns every later step into integer work: a histogram (one row) or a
16-bit radix sort (many short rows) gives the distinct values and their counts without
sorting floats, and once the centroids are known a row's labels come from a table indexed by
rank (or directly by bit pattern) instead of a binary search per weight.
"""

from __future__ import annotations

import functools

import numpy as np

from .sorted_runs import collapse_sorted_rows


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
            by_pattern = _count_patterns(self._patterns[0])
            if by_pattern[rank_of_pattern == NOT_FINITE_RANK].any():
                raise ValueError(_NOT_FINITE)
            real = rank_of_pattern != NOT_FINITE_RANK
            counts = np.bincount(rank_of_pattern[real], weights=by_pattern[real], minlength=ordered.size)
            present = np.flatnonzero(counts)
            self._ranks = None
            self.values = ordered[present][None, :]
            self.counts = counts[present][None, :]
        else:
            self._ranks = rank_of_pattern[self._patterns]
            # numpy sorts 16-bit integers with a radix sort when asked for a stable sort.
            sorted_ranks = np.sort(self._ranks, axis=1, kind="stable")
            if (sorted_ranks[:, -1] == NOT_FINITE_RANK).any():
                raise ValueError(_NOT_FINITE)
            unique_ranks, self.counts = collapse_sorted_rows(sorted_ranks)
            self.values = ordered[unique_ranks]

    def labels(self, midpoints: np.ndarray) -> np.ndarray:
        """Per weight, how many ``midpoints`` [rows, k-1] of its row lie at or below it."""
        ordered, rank_of_pattern = _rank_tables()
        rows, boundaries = midpoints.shape
        label_dtype = np.uint8 if boundaries < 256 else np.intp
        # Ranks from first_above[r, j] on lie at or above midpoint j of row r.
        first_above = np.searchsorted(ordered, midpoints, side="left")
        steps = np.zeros((rows, ordered.size + 1), dtype=label_dtype)
        np.add.at(steps, (np.repeat(np.arange(rows), boundaries), first_above.reshape(-1)), 1)
        label_of_rank = np.cumsum(steps[:, :-1], axis=1, dtype=label_dtype)
        if self._ranks is None:
            # Non-finite patterns were ruled out above; clip keeps their unused entries valid.
            label_of_pattern = label_of_rank[0][np.minimum(rank_of_pattern, ordered.size - 1)]
            return _look_up(label_of_pattern, self._patterns)
        flat_index = self._ranks + (np.arange(rows) * ordered.size)[:, None]
        return label_of_rank.reshape(-1)[flat_index]


def _count_patterns(patterns: np.ndarray) -> np.ndarray:
    """``np.bincount`` of 16-bit patterns over all 65,536 values, a cache-sized slice at a time."""
    counts = np.zeros(1 << 16, dtype=np.int64)
    for start in range(0, patterns.size, _SLICE):
        counts += np.bincount(patterns[start : start + _SLICE], minlength=1 << 16)
    return counts


def _look_up(table: np.ndarray, patterns: np.ndarray) -> np.ndarray:
    """``table[patterns]``, a cache-sized slice at a time."""
    flat_patterns = patterns.reshape(-1)
    out = np.empty(flat_patterns.size, dtype=table.dtype)
    for start in range(0, flat_patterns.size, _SLICE):
        stop = start + _SLICE
        np.take(table, flat_patterns[start:stop], out=out[start:stop])
    return out.reshape(patterns.shape)
