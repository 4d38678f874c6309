"""CumProd (opset 26), unrolled along its (constant) axis: MIL has cumsum but no cumprod,
and exp(cumsum(log x)) breaks on zeros and negatives."""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import dtype_of, is_static, normalize_axis, rank_of, shape_of
from edgebuild_coreml.lowering.registry import lowers

MAX_UNROLLED = 256


@lowers("CumProd", since=26)
def cum_prod(ctx, node):
    x = ctx.input(node, 0)
    rank = rank_of(x)
    axis = normalize_axis(ctx, node, int(np.asarray(ctx.const(node, 1, what="axis")).reshape(-1)[0]), rank)
    length = shape_of(x)[axis]
    if not is_static(length) or length > MAX_UNROLLED:
        ctx.fail(node, f"needs a static axis length of at most {MAX_UNROLLED}", hint="pin the input shapes in the recipe")
    every = [True] * rank
    every[axis] = False
    slices = []
    for i in range(length):
        begin, end = [0] * rank, [0] * rank
        begin[axis], end[axis] = i, i + 1
        slices.append(mb.slice_by_index(x=x, begin=begin, end=end, begin_mask=every, end_mask=every))
    order = list(range(length))[::-1] if ctx.attr(node, "reverse", 0) else list(range(length))
    one = np.float32(1) if dtype_of(x) != "int32" else np.int32(1)
    products, running = {}, None
    for i in order:
        if ctx.attr(node, "exclusive", 0):
            products[i] = running if running is not None else mb.fill_like(ref_tensor=slices[i], value=one)
            running = slices[i] if running is None else mb.mul(x=running, y=slices[i])
        else:
            running = slices[i] if running is None else mb.mul(x=running, y=slices[i])
            products[i] = running
    if length == 1:
        return mb.identity(x=products[0], name=ctx.name(node))
    return mb.concat(values=[products[i] for i in range(length)], axis=axis, name=ctx.name(node))
