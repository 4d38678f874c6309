"""Shape and data-movement ops: reshape, transpose, concat, slice, gather, broadcast, resize, reductions."""

from __future__ import annotations

import numpy as np

from edgebuild.plugin.reference import resampling
from edgebuild_mpsgraph.executor.registry import evaluates


@evaluates("reshape")
def reshape(x, *, shape, **_):
    return [x.reshape(shape)]


@evaluates("transpose")
def transpose(x, *, permutation, **_):
    return [np.ascontiguousarray(np.transpose(x, permutation))]


@evaluates("concatTensors")
def concat(*xs, dimension: int, **_):
    return [np.concatenate(xs, axis=dimension)]


@evaluates("sliceTensor")
def slice_tensor(x, *, starts, ends, strides, **_):
    """Full-rank starts/ends/strides, already clamped by the lowering (MPSGraph's sliceTensor:starts:ends:strides:)."""
    index = tuple(slice(s, None if e < 0 and st < 0 else e, st) for s, e, st in zip(starts, ends, strides))
    return [np.ascontiguousarray(x[index])]


@evaluates("gatherWithUpdatesTensor")
def gather(updates, indices, *, axis: int, batchDimensions: int = 0, **_):
    if batchDimensions:
        raise ValueError("gatherWithUpdatesTensor: batchDimensions > 0 is not used by the lowering")
    return [np.take(updates, indices.astype(np.int64), axis=axis)]


@evaluates("broadcast")
def broadcast(x, *, shape, **_):
    return [np.ascontiguousarray(np.broadcast_to(x, shape))]


# Reductions keep the reduced axes as size 1, like MPSGraph's reductionXWithTensor:axes:.
@evaluates("reductionSum")
def reduction_sum(x, *, axes, **_):
    return [np.sum(x, axis=tuple(axes), keepdims=True).astype(x.dtype)]


@evaluates("reductionMaximum")
def reduction_maximum(x, *, axes, **_):
    return [np.max(x, axis=tuple(axes), keepdims=True)]


@evaluates("reductionMinimum")
def reduction_minimum(x, *, axes, **_):
    return [np.min(x, axis=tuple(axes), keepdims=True)]


@evaluates("mean")
def mean(x, *, axes, **_):
    return [np.mean(x, axis=tuple(axes), keepdims=True, dtype=np.float64).astype(x.dtype)]


@evaluates("variance")
def variance(x, *, axes, **_):
    return [np.var(x, axis=tuple(axes), keepdims=True, dtype=np.float64).astype(x.dtype)]


def _source_index(out_size: int, in_size: int, mode: str, center: bool, align: bool) -> np.ndarray:
    """Source coordinate of each output pixel along one axis (before rounding/interpolation)."""
    dst = np.arange(out_size, dtype=np.float64)
    if align and out_size > 1:
        return dst * (in_size - 1) / (out_size - 1)
    scale = in_size / out_size
    return (dst + 0.5) * scale - 0.5 if center else dst * scale


@evaluates("resizeTensor")
def resize(x, *, size, mode: str, centerResult: bool, alignCorners: bool, layout: str = "NCHW", **_):
    """Resize the two spatial axes of an NCHW tensor to ``size`` = [height, width].

    ``nearest`` picks ``floor(source + 0.5)`` with center-aligned coordinates (= floor of the
    pixel center), ``floor(source)`` otherwise; ``bilinear`` interpolates, clamping at edges.
    """
    if layout != "NCHW":
        raise ValueError(f"resizeTensor: layout {layout!r} is not supported (NCHW only)")
    out = x
    for axis, out_size in ((2, size[0]), (3, size[1])):
        in_size = out.shape[axis]
        src = _source_index(out_size, in_size, mode, centerResult, alignCorners)
        if mode == "nearest":
            index = np.floor(src + 0.5) if centerResult and not alignCorners else (np.round(src) if alignCorners else np.floor(src))
            out = np.take(out, np.clip(index.astype(np.int64), 0, in_size - 1), axis=axis)
        elif mode == "bilinear":
            out = resampling.linear_along(out, axis, src)
        else:
            raise ValueError(f"resizeTensor: mode {mode!r} is not one of nearest, bilinear")
    return [out.astype(x.dtype)]
