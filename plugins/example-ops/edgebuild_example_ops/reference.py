"""The numpy reference: what RMSNorm means, and what every implementation is checked against."""

from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, scale: np.ndarray, *, epsilon: float = 1e-6) -> np.ndarray:
    """``x / sqrt(mean(x**2 over the last axis) + epsilon) * scale``, computed in float64."""
    x64 = x.astype(np.float64)
    rms = np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + epsilon)
    return (x64 / rms * scale.astype(np.float64)).astype(x.dtype)
