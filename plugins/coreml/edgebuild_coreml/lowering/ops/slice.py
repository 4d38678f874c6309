"""Slice (attributes before opset 10, inputs after), with ONNX's clamping and negative steps.

ONNX clamps starts/ends into range per step direction; with a negative step, an end below
the first element means "through index 0", which MIL can only say with ``end_mask``.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types

from edgebuild_coreml.lowering.ops._util import (
    dim,
    empty_of,
    is_const,
    is_static,
    normalize_axis,
    rank_of,
    shape_of,
    to_var,
)
from edgebuild_coreml.lowering.registry import lowers

_INT32_MAX = np.iinfo(np.int32).max


def _bounds(start: int, end: int, step: int, size) -> tuple[int, int, bool, bool]:
    """(begin, end, begin_mask, end_mask) for one axis, following ONNX clamping."""
    if is_static(size):
        if start < 0:
            start += size
        if end < 0:
            end += size
        if step > 0:
            start, end = min(max(start, 0), size), min(max(end, 0), size)
            return start, end, False, False
        start, end = min(max(start, 0), size - 1), min(max(end, -1), size - 1)
        return start, end, False, end == -1
    # Unknown size: express "to the end" with masks; other values pass through.
    huge = abs(end) >= _INT32_MAX
    if step > 0:
        return max(min(start, _INT32_MAX), -_INT32_MAX), min(end, _INT32_MAX), False, huge and end > 0
    return max(min(start, _INT32_MAX), -_INT32_MAX), max(end, -_INT32_MAX), start >= _INT32_MAX, huge and end < 0


@lowers("Slice", until=9)
def slice_attributes(ctx, node):
    return _slice(ctx, node, ctx.input(node, 0), ctx.attr(node, "starts"), ctx.attr(node, "ends"),
                  ctx.attr(node, "axes"), None)


@lowers("Slice", since=10)
def slice_inputs(ctx, node):
    x = ctx.input(node, 0)
    axes = ctx.const(node, 3, optional=True, what="axes")
    steps = ctx.const(node, 4, optional=True, what="steps")
    # constant bounds are read raw: "to the end" is often INT64_MAX, which int32 cannot hold
    starts, ends = ctx.const_value(node.inputs[1]), ctx.const_value(node.inputs[2])
    if starts is None or ends is None:
        # the constant one of the two clipped to int32 ("to the end" as INT64_MAX): Slice clamps anyway
        starts = _int32_bound(starts) if starts is not None else ctx.input(node, 1)
        ends = _int32_bound(ends) if ends is not None else ctx.input(node, 2)
        return _runtime_slice(ctx, node, x, starts, ends, axes, steps)
    return _slice(ctx, node, x, starts, ends, axes, steps)


def _int32_bound(value) -> np.ndarray:
    info = np.iinfo(np.int32)
    return np.clip(np.asarray(value, np.int64), info.min, info.max).astype(np.int32)


def _slice(ctx, node, x, starts, ends, axes, steps):
    """Slice with constant bounds; ``axes`` and ``steps`` may be None (every axis, step 1)."""
    rank = rank_of(x)
    starts = [int(v) for v in np.asarray(starts).reshape(-1)]
    ends = [int(v) for v in np.asarray(ends).reshape(-1)]
    axes = list(range(len(starts))) if axes is None else [normalize_axis(ctx, node, int(a), rank) for a in np.asarray(axes).reshape(-1)]
    steps = [1] * len(starts) if steps is None else [int(s) for s in np.asarray(steps).reshape(-1)]
    if 0 in steps:
        ctx.fail(node, "a step of 0 is invalid")

    dims = shape_of(x)
    begin, end, stride = [0] * rank, [0] * rank, [1] * rank
    begin_mask, end_mask = [True] * rank, [True] * rank
    for axis, s, e, step in zip(axes, starts, ends, steps):
        b, en, bm, em = _bounds(s, e, step, dims[axis])
        begin[axis], end[axis], stride[axis] = b, en, step
        begin_mask[axis], end_mask[axis] = bm, em

    index = tuple(
        slice(None if bm else b, None if em else e, st) for b, e, st, bm, em in zip(begin, end, stride, begin_mask, end_mask)
    )
    value = ctx.const_value(node.inputs[0])
    if value is not None and value.size <= 4096:  # shape arithmetic: keep it a constant
        return np.asarray(value)[index]
    if all(is_static(d) for d in dims):  # an empty window (start >= end): MIL's slice_by_index refuses it
        empty = empty_of([len(range(*part.indices(int(d)))) for part, d in zip(index, dims)], x)
        if empty is not None:
            return empty
    return mb.slice_by_index(
        x=x, begin=np.array(begin, np.int32), end=np.array(end, np.int32), stride=np.array(stride, np.int32),
        begin_mask=begin_mask, end_mask=end_mask, name=ctx.name(node),
    )


def _clamped(ctx, node, bound, sizes, tag: str):
    """ONNX clamping of runtime starts/ends for positive steps: negative values count from
    the end, then everything is clamped into [0, size]."""
    bound = mb.cast(x=bound, dtype="int32", name=ctx.name(node, f"{tag}_int")) if bound.dtype != types.int32 else bound
    negative = mb.less(x=bound, y=np.int32(0), name=ctx.name(node, f"{tag}_negative"))
    wrapped = mb.select(cond=negative, a=mb.add(x=bound, y=sizes, name=ctx.name(node, f"{tag}_from_end")), b=bound,
                        name=ctx.name(node, f"{tag}_wrapped"))
    low = mb.maximum(x=wrapped, y=np.int32(0), name=ctx.name(node, f"{tag}_low"))
    return mb.minimum(x=low, y=sizes, name=ctx.name(node, tag))


def _runtime_slice(ctx, node, x, starts, ends, axes, steps):
    """Slice with starts/ends computed at run time (slice_by_index takes them as tensors);
    axes and steps must stay constant, and steps positive, for MIL's constant stride/masks."""
    rank = rank_of(x)
    count = int(shape_of(starts)[0]) if rank_of(starts) == 1 and is_static(shape_of(starts)[0]) else None
    if axes is None and count is None:
        ctx.fail(node, "runtime starts of unknown length need constant axes", "give the Slice an axes input")
    axes = list(range(count)) if axes is None else [normalize_axis(ctx, node, int(a), rank) for a in np.asarray(axes).reshape(-1)]
    steps = [1] * len(axes) if steps is None else [int(s) for s in np.asarray(steps).reshape(-1)]
    if any(step <= 0 for step in steps):
        ctx.fail(node, "runtime starts/ends need positive steps: a negative step's clamping needs MIL's "
                 "constant end_mask", "make starts and ends constants")
    x = to_var(x)
    sizes = [dim(x, axis) for axis in axes]
    sizes = (np.array(sizes, np.int32) if all(is_const(s) for s in sizes)
             else mb.concat(values=[mb.reshape(x=to_var(s), shape=[1]) for s in sizes], axis=0,
                            name=ctx.name(node, "sizes")))
    begin_sliced = _clamped(ctx, node, to_var(starts), sizes, "begin")
    end_sliced = _clamped(ctx, node, to_var(ends), sizes, "end")
    # Spread the per-axis values over every axis; untouched axes are covered by the masks.
    slot = [axes.index(a) if a in axes else len(axes) for a in range(rank)]
    padded = lambda v, tag: mb.concat(values=[v, np.zeros(1, np.int32)], axis=0, name=ctx.name(node, tag))  # noqa: E731
    begin = mb.gather(x=padded(begin_sliced, "begin_pad"), indices=np.array(slot, np.int32), axis=0,
                      name=ctx.name(node, "begin_full"))
    end = mb.gather(x=padded(end_sliced, "end_pad"), indices=np.array(slot, np.int32), axis=0,
                    name=ctx.name(node, "end_full"))
    stride = [steps[axes.index(a)] if a in axes else 1 for a in range(rank)]
    untouched = [a not in axes for a in range(rank)]
    return mb.slice_by_index(x=x, begin=begin, end=end, stride=np.array(stride, np.int32),
                             begin_mask=untouched, end_mask=untouched, name=ctx.name(node))
