"""MaxPool, AveragePool, LpPool and their Global forms.

ONNX pooling windows (ceil_mode, dilations, count_include_pad) are laid out here, in numpy:
the output size, the explicit pads, and the extra tail padding ceil_mode needs. MIL then
only ever pools with explicit pads and ceil_mode=False, which it expresses exactly; an
average's divisor is applied as a precomputed constant where MIL's own rule would differ.
Dilated windows and MaxPool's Indices output are built from strided slices instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types

from edgebuild_coreml.lowering.ops._nn_util import (
    as_float,
    fconst,
    is_float,
    mil_pads,
    rank_of,
    same_pads,
    shape_of,
    static_shape,
)
from edgebuild_coreml.lowering.registry import lowers


@dataclass
class Windows:
    """Where ONNX places the pooling windows along each spatial axis."""

    kernel: list[int]
    strides: list[int]
    dilations: list[int]
    begins: list[int]  # ONNX pads before each axis
    ends: list[int]  # ONNX pads after each axis
    tails: list[int]  # extra padding after ``ends`` so floor-mode pooling yields ceil-mode sizes
    out: list[int]

    @property
    def span(self) -> list[int]:
        return [(k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations)]


def _windows(ctx, node, in_sizes) -> Windows:
    """``in_sizes`` may hold symbols (flexible sizes): then ``out`` holds None there, and only
    layouts whose pads do not depend on the size (explicit or VALID, floor mode) are accepted."""
    kernel = [int(k) for k in ctx.attr(node, "kernel_shape")]
    n = len(kernel)
    strides = [int(s) for s in ctx.attr(node, "strides", [1] * n)]
    dilations = [int(d) for d in ctx.attr(node, "dilations", [1] * n)]
    ceil_mode = bool(ctx.attr(node, "ceil_mode", 0))
    auto_pad = ctx.attr(node, "auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    flexible = not all(isinstance(s, (int, np.integer)) for s in in_sizes)
    if flexible and (ceil_mode or auto_pad in ("SAME_UPPER", "SAME_LOWER")):
        ctx.fail(node, f"{'ceil_mode' if ceil_mode else auto_pad} pooling places its windows by the input size, "
                       "which is flexible here", "pin the spatial input shapes in the recipe (or enumerate them)")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = same_pads(in_sizes, kernel, strides, dilations, auto_pad == "SAME_UPPER")
    elif auto_pad == "VALID":
        pads = [0] * 2 * n
    else:
        pads = [int(p) for p in ctx.attr(node, "pads", [0] * 2 * n)]
    begins, ends = pads[:n], pads[n:]
    out, tails = [], []
    for size, k, s, d, b, e in zip(in_sizes, kernel, strides, dilations, begins, ends):
        span = (k - 1) * d + 1
        if not isinstance(size, (int, np.integer)):  # floor mode: no tail, the output size is MIL's
            out.append(None)
            tails.append(0)
            continue
        room = size + b + e - span
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-size // s)
        elif ceil_mode:
            o = -(-room // s) + 1
            if (o - 1) * s >= size + b:  # a window may not start in the end padding
                o -= 1
        else:
            o = room // s + 1
        out.append(o)
        tails.append(max(0, (o - 1) * s + span - (size + b + e)))
    return Windows(kernel, strides, dilations, begins, ends, tails, out)


def _input_with_shape(ctx, node):
    """The input and its shape (symbols where flexible: see ``_windows``)."""
    x = as_float(ctx.input(node, 0))
    shape = shape_of(x)
    if not 3 <= len(shape) <= 5:
        ctx.fail(node, f"Core ML pools 1-D to 3-D inputs; this input has rank {len(shape)}")
    return x, shape


def _window_taps(ctx, node, x, w: Windows, pad_value: float, tag: str):
    """One strided slice of the padded input per kernel tap (for dilations / indices)."""
    rank = rank_of(x)
    total = [b + e + t for b, e, t in zip(w.begins, w.ends, w.tails)]
    if any(total):
        x = mb.pad(x=x, pad=[0, 0, 0, 0] + mil_pads(w.begins + [e + t for e, t in zip(w.ends, w.tails)]),
                   mode="constant", constant_val=float(pad_value), name=ctx.name(node, tag + "_pad"))
    taps = []
    for offsets in np.ndindex(*w.kernel):
        begin = [0, 0] + [o * d for o, d in zip(offsets, w.dilations)]
        end = [0, 0] + [o * d + (n - 1) * s + 1 for o, d, n, s in zip(offsets, w.dilations, w.out, w.strides)]
        taps.append(mb.slice_by_index(
            x=x, begin=begin, end=end, stride=[1, 1] + w.strides,
            begin_mask=[True, True] + [False] * (rank - 2), end_mask=[True, True] + [False] * (rank - 2),
            name=ctx.name(node, f"{tag}_tap"),
        ))
    return taps


def _flat_indices(shape, w: Windows, storage_order: int) -> np.ndarray:
    """[taps, 1, 1, *out] flat input index (within one N*C plane) of each tap's element."""
    spatial = list(shape[2:])
    grids = []
    for offsets in np.ndindex(*w.kernel):
        coords = [np.arange(n) * s - b + o * d for n, s, b, o, d in zip(w.out, w.strides, w.begins, offsets, w.dilations)]
        mesh = np.meshgrid(*coords, indexing="ij")
        if storage_order == 1:  # column-major: the first spatial axis varies fastest
            flat = reduce(lambda acc, i: acc * spatial[i] + mesh[i], range(len(spatial) - 1, -1, -1), 0)
        else:
            flat = reduce(lambda acc, i: acc * spatial[i] + mesh[i], range(len(spatial)), 0)
        grids.append(flat)
    return np.stack(grids)[:, None, None].astype(np.int32)


@lowers("MaxPool")
def max_pool(ctx, node):
    """MIL pools float tensors only: integer inputs (int8/uint8, carried as int32) are pooled
    in fp32, exact for 8-bit values and max being a selection, and cast back."""
    x, shape = _input_with_shape(ctx, node)
    if is_float(x):
        return _max_pool_float(ctx, node, x, shape)
    if not isinstance(x, np.ndarray) and x.dtype == types.bool:
        ctx.fail(node, "MaxPool of a bool tensor is not defined", "cast it to a number first")
    widened = mb.cast(x=x, dtype="fp32", name=ctx.name(node, "as_float"))
    pooled = _max_pool_float(ctx, node, widened, shape, final_name=ctx.name(node, "pooled"))
    if isinstance(pooled, tuple):
        values, indices = pooled
        return mb.cast(x=values, dtype="int32", name=ctx.name(node)), indices
    return mb.cast(x=pooled, dtype="int32", name=ctx.name(node))


def _max_pool_float(ctx, node, x, shape, final_name: str | None = None):
    final_name = final_name or ctx.name(node)
    w = _windows(ctx, node, list(shape[2:]))
    wants_indices = len(node.outputs) > 1 and node.outputs[1] is not None and node.outputs[1].name != ""
    dilated = any(d != 1 for d in w.dilations)
    if (dilated or wants_indices) and static_shape(x) is None:
        ctx.fail(node, "MaxPool with dilations or an Indices output is built from strided slices sized by the "
                       "input, which is flexible here", "pin the spatial input shapes in the recipe")
    if not dilated and not wants_indices:
        pad = mil_pads(w.begins + [e + t for e, t in zip(w.ends, w.tails)])
        return mb.max_pool(x=x, kernel_sizes=w.kernel, strides=w.strides, pad_type="custom", pad=pad,
                           ceil_mode=False, name=final_name)
    taps = _window_taps(ctx, node, x, w, -np.inf, "max")
    stacked = mb.stack(values=taps, axis=0, name=ctx.name(node, "taps"))
    values = mb.reduce_max(x=stacked, axes=[0], keep_dims=False, name=final_name)
    if not wants_indices:
        return values
    which = mb.reduce_argmax(x=stacked, axis=0, keep_dims=True, name=ctx.name(node, "which"))
    storage_order = int(ctx.attr(node, "storage_order", 0))
    flat = _flat_indices(shape, w, storage_order)
    flat = np.broadcast_to(flat, [flat.shape[0], shape[0], shape[1], *w.out]).copy()
    plane = int(np.prod(shape[2:]))
    flat += (np.arange(shape[0] * shape[1]).reshape(1, shape[0], shape[1], *[1] * len(w.out)) * plane).astype(np.int32)
    picked = mb.gather_along_axis(x=flat, indices=which, axis=0, name=ctx.name(node, "picked"))
    indices = mb.squeeze(x=picked, axes=[0], name=ctx.name(node, "indices"))
    return values, indices


def _window_counts(w: Windows, in_sizes, include_pad: bool) -> np.ndarray:
    """How many taps of each output window ONNX divides by (separable per axis)."""
    counts = []
    for size, n, s, b, e, k, d in zip(in_sizes, w.out, w.strides, w.begins, w.ends, w.kernel, w.dilations):
        pos = np.arange(n)[:, None] * s - b + np.arange(k)[None, :] * d
        low, high = (-b, size + e) if include_pad else (0, size)
        counts.append(((pos >= low) & (pos < high)).sum(axis=1))
    return reduce(np.multiply.outer, counts).astype(np.float32)


def _window_sum(ctx, node, x, w: Windows, tag: str):
    """Sum over each zero-padded window (taps outside the input count as 0)."""
    if any(d != 1 for d in w.dilations):
        taps = _window_taps(ctx, node, x, w, 0.0, tag)
        stacked = mb.stack(values=taps, axis=0, name=ctx.name(node, tag + "_taps"))
        return mb.reduce_sum(x=stacked, axes=[0], keep_dims=False, name=ctx.name(node, tag + "_sum"))
    pad = mil_pads(w.begins + [e + t for e, t in zip(w.ends, w.tails)])
    mean = mb.avg_pool(x=x, kernel_sizes=w.kernel, strides=w.strides, pad_type="custom", pad=pad,
                       exclude_padding_from_average=False, ceil_mode=False, name=ctx.name(node, tag + "_mean"))
    return mb.mul(x=mean, y=fconst(x, float(np.prod(w.kernel))), name=ctx.name(node, tag + "_sum"))


@lowers("AveragePool")
def average_pool(ctx, node):
    x, shape = _input_with_shape(ctx, node)
    w = _windows(ctx, node, list(shape[2:]))
    include_pad = bool(ctx.attr(node, "count_include_pad", 0))
    plain = not any(w.tails) and all(d == 1 for d in w.dilations)
    if plain:  # MIL's own divisor rule is ONNX's when there is no ceil tail
        pad = mil_pads(w.begins + w.ends)
        return mb.avg_pool(x=x, kernel_sizes=w.kernel, strides=w.strides, pad_type="custom", pad=pad,
                           exclude_padding_from_average=not include_pad, ceil_mode=False, name=ctx.name(node))
    if static_shape(x) is None:
        ctx.fail(node, "AveragePool with dilations is built from strided slices sized by the input, which is "
                       "flexible here", "pin the spatial input shapes in the recipe")
    total = _window_sum(ctx, node, x, w, "avg")
    inverse = 1.0 / np.maximum(_window_counts(w, shape[2:], include_pad), 1.0)
    return mb.mul(x=total, y=inverse.astype(fconst(x, 0).dtype), name=ctx.name(node))


@lowers("LpPool")
def lp_pool(ctx, node):
    """(sum over the window of |x|^p)^(1/p); padding contributes zeros."""
    x, shape = _input_with_shape(ctx, node)
    w = _windows(ctx, node, list(shape[2:]))
    p = float(ctx.attr(node, "p", 2))
    if static_shape(x) is None and any(d != 1 for d in w.dilations):
        ctx.fail(node, "LpPool with dilations is built from strided slices sized by the input, which is "
                       "flexible here", "pin the spatial input shapes in the recipe")
    powered = _abs_pow(ctx, node, x, p)
    total = _window_sum(ctx, node, powered, w, "lp")
    return _root(ctx, node, total, p)


def _abs_pow(ctx, node, x, p: float):
    if p == 2.0:
        return mb.mul(x=x, y=x, name=ctx.name(node, "sq"))
    magnitude = mb.abs(x=x, name=ctx.name(node, "abs"))
    return mb.pow(x=magnitude, y=fconst(x, p), name=ctx.name(node, "pow"))


def _root(ctx, node, total, p: float):
    if p == 2.0:
        return mb.sqrt(x=total, name=ctx.name(node))
    if p == 1.0:
        return mb.identity(x=total, name=ctx.name(node))
    return mb.pow(x=total, y=fconst(total, 1.0 / p), name=ctx.name(node))


def _spatial_axes(ctx, node, x) -> list[int]:
    rank = rank_of(x)
    if rank < 3:
        ctx.fail(node, f"expects an N x C x D1 x ... input; got rank {rank}")
    return list(range(2, rank))


@lowers("GlobalAveragePool")
def global_average_pool(ctx, node):
    x = as_float(ctx.input(node, 0))
    return mb.reduce_mean(x=x, axes=_spatial_axes(ctx, node, x), keep_dims=True, name=ctx.name(node))


@lowers("GlobalMaxPool")
def global_max_pool(ctx, node):
    x = as_float(ctx.input(node, 0))
    return mb.reduce_max(x=x, axes=_spatial_axes(ctx, node, x), keep_dims=True, name=ctx.name(node))


@lowers("GlobalLpPool")
def global_lp_pool(ctx, node):
    x = as_float(ctx.input(node, 0))
    p = float(ctx.attr(node, "p", 2))
    powered = _abs_pow(ctx, node, x, p)
    total = mb.reduce_sum(x=powered, axes=_spatial_axes(ctx, node, x), keep_dims=True, name=ctx.name(node, "sum"))
    return _root(ctx, node, total, p)
