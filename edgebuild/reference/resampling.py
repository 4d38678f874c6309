"""Sampling a tensor at fractional positions along one axis (resize, crop-and-resize)."""

from __future__ import annotations

import numpy as np


def linear_along(arr: np.ndarray, axis: int, positions: np.ndarray, fill=None) -> np.ndarray:
    """Linear interpolation of ``arr`` along ``axis`` at fractional ``positions``, clamped to
    ``[0, n-1]``; with ``fill`` given, positions outside that range yield ``fill`` instead."""
    n = arr.shape[axis]
    clamped = np.clip(positions, 0, n - 1)
    low = np.floor(clamped).astype(np.int64)
    high = np.minimum(low + 1, n - 1)
    shape = [1] * arr.ndim
    shape[axis] = len(positions)
    frac = (clamped - low).astype(arr.dtype).reshape(shape)
    out = np.take(arr, low, axis=axis) * (1 - frac) + np.take(arr, high, axis=axis) * frac
    if fill is not None:
        outside = ((positions < 0) | (positions > n - 1)).reshape(shape)
        out = np.where(outside, np.asarray(fill, dtype=arr.dtype), out)
    return out
