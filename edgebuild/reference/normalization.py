"""Normalisation: standardising over axes, and applying given statistics (batch norm)."""

from __future__ import annotations

import numpy as np


def standardize(x: np.ndarray, axes: tuple[int, ...], epsilon: float) -> np.ndarray:
    """``(x - mean) / sqrt(variance + epsilon)`` with the mean and (biased) variance over
    ``axes``, as layer and instance normalisation define them."""
    centered = x - x.mean(axis=axes, keepdims=True)
    variance = np.mean(centered * centered, axis=axes, keepdims=True)
    return centered / np.sqrt(variance + epsilon)


def batch_normalize(x: np.ndarray, mean, variance, epsilon: float, scale=None, bias=None) -> np.ndarray:
    """``(x - mean) / sqrt(variance + epsilon) * scale + bias`` with the statistics given,
    each already shaped to broadcast against ``x``; ``scale`` and ``bias`` are optional."""
    return scale_and_shift((x - mean) / np.sqrt(variance + epsilon), scale, bias)


def scale_and_shift(y: np.ndarray, scale=None, bias=None) -> np.ndarray:
    """``y * scale + bias``, each optional (the affine step after normalising)."""
    if scale is not None:
        y = y * scale
    if bias is not None:
        y = y + bias
    return y
