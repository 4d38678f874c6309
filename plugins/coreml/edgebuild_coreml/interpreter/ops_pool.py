"""Pooling evaluators: ``avg_pool``, ``max_pool``, ``l2_pool`` (1-D, 2-D and 3-D)."""

from __future__ import annotations

import numpy as np

from ._params import as_float, ints, param, scalar
from ._windows import explicit_pads, output_sizes, pad_spatial, windows
from .registry import evaluates


def _geometry(op, x, inp):
    nd = inp.ndim - 2
    kernel = ints(x["kernel_sizes"])
    strides = ints(param(op, x, "strides", [1] * nd))
    pad_type = str(scalar(param(op, x, "pad_type", "valid")))
    pads = explicit_pads(pad_type, inp.shape[2:], kernel, strides, param(op, x, "pad", [0] * 2 * nd))
    ceil_mode = bool(scalar(param(op, x, "ceil_mode", False)))
    out_sizes = output_sizes(inp.shape[2:], kernel, strides, pads, ceil_mode)
    return kernel, strides, pads, out_sizes


def _pooled(arr, kernel, strides, pads, out_sizes, fill):
    padded = pad_spatial(arr, pads, out_sizes, kernel, strides, fill=fill)
    return windows(padded, kernel, strides, [1] * len(kernel), out_sizes)


def _kernel_axes(nd):
    return tuple(range(-nd, 0))


@evaluates("max_pool")
def max_pool(op, x):
    inp = as_float(x["x"])
    kernel, strides, pads, out_sizes = _geometry(op, x, inp)
    inside = not any(b or a for b, a in pads) and all(
        (o - 1) * s + k <= size for o, s, k, size in zip(out_sizes, strides, kernel, inp.shape[2:]))
    padded = inp if inside else pad_spatial(inp, pads, out_sizes, kernel, strides, fill=-np.inf)
    return _running_max(padded, kernel, strides, out_sizes)


def _running_max(padded, kernel, strides, out_sizes):
    """Max pooling one spatial dim at a time (a window's max is the max of its rows' maxima), each
    a running ``np.maximum`` over that dim's taps: sum(K) whole-array calls where a max over the
    windows view makes prod(K) strided passes (169 for a 13x13 SPP pool), element by element, and
    torch's NCHW max_pool2d on one thread is several times slower still. Exact, NaN-propagating;
    the result is a fresh array (later ops may write into it)."""
    result = padded
    for axis, (k, stride, size) in enumerate(zip(kernel, strides, out_sizes), start=2):
        reduced = _tap_along(result, axis, 0, stride, size).copy()
        for tap in range(1, k):
            np.maximum(reduced, _tap_along(result, axis, tap, stride, size), out=reduced)
        result = reduced
    return result


def _tap_along(array, axis, tap, stride, size):
    """The ``size`` elements along ``axis`` that kernel tap ``tap`` reads, as a view."""
    return array[(slice(None),) * axis + (slice(tap, tap + (size - 1) * stride + 1, stride),)]


@evaluates("l2_pool")
def l2_pool(op, x):
    inp = as_float(x["x"])
    kernel, strides, pads, out_sizes = _geometry(op, x, inp)
    win = _pooled(inp * inp, kernel, strides, pads, out_sizes, 0.0)
    return np.sqrt(win.sum(axis=_kernel_axes(len(kernel))))


@evaluates("avg_pool")
def avg_pool(op, x):
    inp = as_float(x["x"])
    kernel, strides, pads, out_sizes = _geometry(op, x, inp)
    axes = _kernel_axes(len(kernel))
    total = _pooled(inp, kernel, strides, pads, out_sizes, 0.0).sum(axis=axes)

    # The divisor counts window cells on real input, plus explicit padding unless excluded.
    # Cells that ceil_mode adds beyond the explicit padding never count (as in PyTorch).
    exclude = bool(scalar(param(op, x, "exclude_padding_from_average", False)))
    ones = np.ones((1, 1) + inp.shape[2:], dtype=inp.dtype)
    if exclude:
        count = _pooled(ones, kernel, strides, pads, out_sizes, 0.0)
    else:
        bordered = np.pad(ones, [(0, 0), (0, 0)] + [tuple(p) for p in pads], constant_values=1.0)
        count = _pooled(bordered, kernel, strides, [(0, 0)] * len(pads), out_sizes, 0.0)
    count = count.sum(axis=axes)
    return total / np.maximum(count, 1)
