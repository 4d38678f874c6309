"""Small helpers shared by the NN lowerings (shapes, pads, dtypes); registers nothing."""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types
from coremltools.converters.mil.mil.types.symbolic import is_symbolic


def shape_of(x) -> tuple:
    """Shape of a Var or numpy value; symbolic dims stay symbolic."""
    return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


def static_shape(x) -> tuple[int, ...] | None:
    """The fully known shape, or None when some dim is symbolic."""
    shape = shape_of(x)
    if any(is_symbolic(d) for d in shape):
        return None
    return tuple(int(d) for d in shape)


def rank_of(x) -> int:
    return len(shape_of(x))


def is_float(x) -> bool:
    if isinstance(x, np.ndarray):
        return x.dtype.kind == "f"
    return types.is_float(x.dtype)


def float_np(x) -> type:
    """numpy float type matching a Var (fp16 Vars get fp16 constants)."""
    if not isinstance(x, np.ndarray) and x.dtype == types.fp16:
        return np.float16
    return np.float32


def fconst(x, value) -> np.ndarray:
    """A float constant with the dtype of ``x`` (MIL refuses fp16 op fp32)."""
    return np.asarray(value, dtype=float_np(x))


def as_float(x):
    """numpy constants arrive as float64/int; MIL wants fp32 tensors."""
    if isinstance(x, np.ndarray) and x.dtype.kind == "f" and x.dtype != np.float16:
        return x.astype(np.float32, copy=False)  # a float32 weight stays a view of its mapped file
    return x


def mil_pads(begin_end: list[int]) -> list[int]:
    """ONNX pads [b1, b2, ..., e1, e2, ...] -> MIL pads [b1, e1, b2, e2, ...]."""
    n = len(begin_end) // 2
    out: list[int] = []
    for i in range(n):
        out += [int(begin_end[i]), int(begin_end[n + i])]
    return out


def same_pads(in_sizes, kernel, strides, dilations, upper: bool) -> list[int]:
    """ONNX SAME_UPPER/SAME_LOWER explicit pads in ONNX order (begins, then ends)."""
    begins, ends = [], []
    for size, k, s, d in zip(in_sizes, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begins.append(small if upper else big)
        ends.append(big if upper else small)
    return begins + ends


def per_channel(vector, rank: int):
    """Reshape a [C] vector to [1, C, 1, ...] to broadcast over NC... tensors."""
    shape = [1, -1] + [1] * (rank - 2)
    if isinstance(vector, np.ndarray):
        return vector.reshape(shape)
    return mb.reshape(x=vector, shape=shape)
