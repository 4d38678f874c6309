"""Elementwise kernels that need temporaries work through a tensor a slice at a time: the
temporaries of an activation over a full-resolution tensor would be several times its size."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

SLICE_VALUES = 1 << 16  # values per slice


def float_type(x: np.ndarray) -> np.dtype:
    """The dtype a kernel returns for ``x``: its own floating-point type, float64 for others."""
    return x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)


def flat_slices(size: int) -> Iterator[slice]:
    for start in range(0, size, SLICE_VALUES):
        yield slice(start, start + SLICE_VALUES)


def map_in_float64(fn: Callable[[np.ndarray], np.ndarray], x) -> np.ndarray:
    """``fn`` applied to ``x`` computed in float64 a slice at a time, each result rounded once
    into an array of ``x``'s float type."""
    x = np.asarray(x)
    out = np.empty(x.shape, float_type(x))
    flat_in, flat_out = x.reshape(-1), out.reshape(-1)
    for part in flat_slices(flat_in.size):
        flat_out[part] = fn(flat_in[part].astype(np.float64))
    return out
