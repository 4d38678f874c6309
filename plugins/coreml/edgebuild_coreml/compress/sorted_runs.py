"""Runs of equal values in sorted rows, collapsed to one value with a total weight."""

from __future__ import annotations

import numpy as np


def collapse_sorted_rows(
    sorted_rows: np.ndarray, weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(distinct [rows, width], totals [rows, width])`` for rows sorted ascending.

    ``totals`` are the run lengths, or the sums of ``weights`` over each run. Rows with fewer
    distinct values than ``width`` are padded with their last value at total 0, which keeps
    them sorted and adds nothing to any sum.
    """
    rows, n = sorted_rows.shape
    is_start = np.ones((rows, n), dtype=bool)
    np.not_equal(sorted_rows[:, 1:], sorted_rows[:, :-1], out=is_start[:, 1:])
    distinct = is_start.sum(axis=1)
    width = int(distinct.max())
    # Every row's first element starts a run, so runs never cross rows in the flat layout.
    flat_starts = np.flatnonzero(is_start)
    row_of = flat_starts // n
    slot = np.arange(flat_starts.size) - np.repeat(np.cumsum(distinct) - distinct, distinct)
    unique = np.repeat(sorted_rows[:, -1:], width, axis=1)
    unique[row_of, slot] = sorted_rows.reshape(-1)[flat_starts]
    if weights is None:
        run_totals = np.diff(np.append(flat_starts, rows * n)).astype(np.float64)
    else:
        run_totals = np.add.reduceat(np.ascontiguousarray(weights).reshape(-1), flat_starts)
    totals = np.zeros((rows, width))
    totals[row_of, slot] = run_totals
    return unique, totals
