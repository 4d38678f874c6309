"""Reductions along axes that need care with large values: softmax and log-sum-exp."""

from __future__ import annotations

import numpy as np

from edgebuild.reference.slices import float_type


def softmax(x, axis: int = -1) -> np.ndarray:
    """``exp(x) / sum(exp(x))`` along ``axis``, shifted by the maximum so nothing overflows;
    in ``x``'s float type, with one temporary the size of ``x``."""
    x = np.asarray(x)
    shifted = np.subtract(x, np.max(x, axis=axis, keepdims=True), dtype=float_type(x))
    np.exp(shifted, out=shifted)
    shifted /= np.sum(shifted, axis=axis, keepdims=True)
    return shifted


def log_sum_exp(x, axis=None, keepdims: bool = False) -> np.ndarray:
    """``log(sum(exp(x)))`` over ``axis`` (all axes when None), shifted by the maximum so large
    values do not overflow; an infinite maximum is not subtracted (inf - inf would be NaN)."""
    x = np.asarray(x)
    axis = tuple(range(x.ndim)) if axis is None else axis
    peak = np.max(x, axis=axis, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0)
    total = np.sum(np.exp(x - peak), axis=axis, keepdims=True)
    with np.errstate(divide="ignore"):  # log(0) = -inf is the answer for all -inf
        result = np.log(total) + peak
    return result if keepdims else np.squeeze(result, axis=axis)
