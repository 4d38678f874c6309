"""Slice (attributes before opset 10, inputs after), with ONNX's clamping and negative steps.

ONNX clamps starts/ends into range per step direction; with a negative step, an end below
the first element means "through index 0", which MIL can only say with ``end_mask``.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import is_static, normalize_axis, rank_of, shape_of
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


@lowers("Slice")
def slice_(ctx, node):
    x = ctx.input(node, 0)
    rank = rank_of(x)
    if ctx.opset < 10:
        starts, ends, axes, steps = ctx.attr(node, "starts"), ctx.attr(node, "ends"), ctx.attr(node, "axes"), None
    else:
        starts = ctx.const(node, 1, what="starts")
        ends = ctx.const(node, 2, what="ends")
        axes = ctx.const(node, 3, optional=True, what="axes")
        steps = ctx.const(node, 4, optional=True, what="steps")
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

    value = ctx.const_value(node.inputs[0])
    if value is not None and value.size <= 4096:  # shape arithmetic: keep it a constant
        index = tuple(
            slice(None if bm else b, None if em else e, st) for b, e, st, bm, em in zip(begin, end, stride, begin_mask, end_mask)
        )
        return np.asarray(value)[index]
    return mb.slice_by_index(
        x=x, begin=np.array(begin, np.int32), end=np.array(end, np.int32), stride=np.array(stride, np.int32),
        begin_mask=begin_mask, end_mask=end_mask, name=ctx.name(node),
    )
