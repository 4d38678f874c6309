"""Sliding-window helpers shared by the convolution and pooling evaluators.

Windows are strided numpy views (no copies, no per-pixel loops): a padded input of shape
``[N, C, *D]`` becomes ``[N, C, *D_out, *K]`` and the reduction is a sum/einsum/max over the
trailing kernel axes.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def effective_kernel(kernel, dilations) -> list[int]:
    return [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]


def explicit_pads(pad_type: str, in_sizes, eff_kernel, strides, custom_pad) -> list[tuple[int, int]]:
    """(before, after) padding per spatial dim, as the MIL ``pad_type`` defines it."""
    pad_type = str(pad_type).lower()
    if pad_type == "valid":
        return [(0, 0)] * len(in_sizes)
    if pad_type == "custom":
        pad = [int(p) for p in np.asarray(custom_pad).reshape(-1)]
        return [(pad[2 * i], pad[2 * i + 1]) for i in range(len(in_sizes))]
    if pad_type in ("same", "same_lower"):
        pads = []
        for size, k, s in zip(in_sizes, eff_kernel, strides):
            total = max(0, (math.ceil(size / s) - 1) * s + k - size)
            small, large = total // 2, total - total // 2
            pads.append((small, large) if pad_type == "same" else (large, small))
        return pads
    raise ValueError(f"unknown pad_type {pad_type!r}")


def output_sizes(in_sizes, eff_kernel, strides, pads, ceil_mode=False) -> list[int]:
    """Spatial output sizes; ``ceil_mode`` follows PyTorch (and coremltools' shape inference)."""
    sizes = []
    for size, k, s, (before, after) in zip(in_sizes, eff_kernel, strides, pads):
        total = before + after
        if not ceil_mode:
            sizes.append((size + total - k) // s + 1)
            continue
        out = (size + total - k + s - 1) // s + 1
        if total > 0 and (out - 1) * s >= size + total / 2:
            out -= 1
        sizes.append(out)
    return sizes


def pad_spatial(x: np.ndarray, pads, out_sizes, eff_kernel, strides, fill=0.0) -> np.ndarray:
    """Pad the spatial dims of ``[N, C, *D]`` so every output window lies inside the array.

    The right side gets at least the explicit padding, more when ceil_mode windows run past it.
    """
    widths = [(0, 0), (0, 0)]
    for size, (before, after), out, k, s in zip(x.shape[2:], pads, out_sizes, eff_kernel, strides):
        needed_after = (out - 1) * s + k - size - before
        widths.append((before, max(after, needed_after, 0)))
    return np.pad(x, widths, mode="constant", constant_values=fill)


def windows(xp: np.ndarray, kernel, strides, dilations, out_sizes) -> np.ndarray:
    """Strided view ``[N, C, *D_out, *K]`` over a padded ``[N, C, *D]`` input."""
    nd = len(kernel)
    eff = effective_kernel(kernel, dilations)
    view = sliding_window_view(xp, eff, axis=tuple(range(2, 2 + nd)))
    picks = (slice(None), slice(None))
    picks += tuple(slice(0, (o - 1) * s + 1, s) for o, s in zip(out_sizes, strides))
    picks += tuple(slice(None, None, d) for d in dilations)
    return view[picks]


def padded_rows(x: np.ndarray, pads, out_sizes, eff_kernel, strides, start: int, stop: int, fill=0.0) -> np.ndarray:
    """``pad_spatial`` of only the input rows (first spatial dim) that output rows
    ``[start, stop)`` read, so a band of a large image is padded without copying all of it."""
    size, before = x.shape[2], pads[0][0]
    lo = start * strides[0] - before  # first and one-past-last input row read
    hi = (stop - 1) * strides[0] + eff_kernel[0] - before
    band = x[:, :, max(lo, 0):max(min(hi, size), 0)]
    band_pads = [(max(-lo, 0), max(hi - size, 0)), *pads[1:]]
    return pad_spatial(band, band_pads, [stop - start, *out_sizes[1:]], eff_kernel, strides, fill)
