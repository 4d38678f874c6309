"""What Swish2 means: the numpy reference validation evaluates the source model with."""

from __future__ import annotations

import numpy as np


def swish2(x: np.ndarray, *, beta: float = 1.0) -> np.ndarray:
    """``x * sigmoid(beta * x)``, computed in float64."""
    x64 = x.astype(np.float64)
    return (x64 / (1.0 + np.exp(-beta * x64))).astype(x.dtype)
