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


def rms_normalization(x: np.ndarray, scale, axis: int, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """``x / sqrt(mean(x^2 over axis..last) + epsilon) * scale`` and the inverse RMS (kept dims).

    Statistics in float32 at least, as onnxruntime's SimplifiedLayerNormalization keeps them.
    """
    axis = axis % x.ndim
    wide = x.astype(np.promote_types(x.dtype, np.float32))
    inverse_rms = 1.0 / np.sqrt(np.mean(wide * wide, axis=tuple(range(axis, x.ndim)), keepdims=True) + epsilon)
    y = (wide * inverse_rms).astype(x.dtype) * scale
    return y.astype(np.result_type(x.dtype, np.asarray(scale).dtype)), inverse_rms.astype(np.float32)
