"""CenterCropPad (opset 18): crop or zero-pad chosen axes to a constant size, centred
(an odd difference puts the extra element at the end)."""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import is_static, normalize_axis, rank_of, shape_of
from edgebuild_coreml.lowering.registry import lowers


@lowers("CenterCropPad", since=18)
def center_crop_pad(ctx, node):
    x = ctx.input(node, 0)
    sizes = [int(s) for s in np.asarray(ctx.const(node, 1, what="shape")).reshape(-1)]
    rank, dims = rank_of(x), shape_of(x)
    axes = ctx.attr(node, "axes") or list(range(rank))
    axes = [normalize_axis(ctx, node, int(a), rank) for a in axes]
    if len(axes) != len(sizes):
        ctx.fail(node, f"shape has {len(sizes)} entries for {len(axes)} axes")
    begin, end, pads = [0] * rank, list(dims), [0] * (2 * rank)
    for axis, size in zip(axes, sizes):
        if not is_static(dims[axis]):
            ctx.fail(node, "needs static sizes on the cropped/padded axes", hint="pin the input shapes in the recipe")
        difference = abs(dims[axis] - size)
        if size < dims[axis]:
            begin[axis], end[axis] = difference // 2, difference // 2 + size
        elif size > dims[axis]:
            pads[2 * axis], pads[2 * axis + 1] = difference // 2, difference - difference // 2
    if begin != [0] * rank or end != list(dims):
        x = mb.slice_by_index(x=x, begin=np.array(begin, np.int32), end=np.array(end, np.int32))
    if any(pads):
        x = mb.pad(x=x, pad=np.array(pads, np.int32), mode="constant", constant_val=0.0)
    return mb.identity(x=x, name=ctx.name(node))
