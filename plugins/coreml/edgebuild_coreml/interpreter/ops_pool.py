"""Pooling evaluators: ``avg_pool``, ``max_pool``, ``l2_pool`` (1-D, 2-D and 3-D)."""

from __future__ import annotations

import itertools

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


#: kernel taps up to which max_pool takes the maximum tap by tap (one ``np.maximum`` over the
#: whole output per tap); past it, over a strided window view (whose ``max`` goes element by
#: element: several times slower on a conv net's pools, as is torch's NCHW max_pool2d on one thread)
MAX_TAPS = 16


@evaluates("max_pool")
def max_pool(op, x):
    inp = as_float(x["x"])
    kernel, strides, pads, out_sizes = _geometry(op, x, inp)
    if int(np.prod(kernel)) <= MAX_TAPS and all(out_sizes):
        inside = not any(b or a for b, a in pads) and all(
            (o - 1) * s + k <= size for o, s, k, size in zip(out_sizes, strides, kernel, inp.shape[2:]))
        padded = inp if inside else pad_spatial(inp, pads, out_sizes, kernel, strides, fill=-np.inf)
        return _max_over_taps(padded, kernel, strides, out_sizes)
    win = _pooled(inp, kernel, strides, pads, out_sizes, -np.inf)
    return win.max(axis=_kernel_axes(len(kernel)))


def _max_over_taps(padded: np.ndarray, kernel, strides, out_sizes) -> np.ndarray:
    """The maximum of every window, kernel tap by kernel tap: each tap reads a strided view of
    ``padded`` (every window's element at that tap) into the running maximum."""
    out = None
    for tap in itertools.product(*(range(k) for k in kernel)):
        view = padded[(Ellipsis, *(slice(t, t + (o - 1) * s + 1, s) for t, o, s in zip(tap, out_sizes, strides)))]
        if out is None:
            out = view.copy()
        else:
            np.maximum(out, view, out=out)
    return out


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
