"""MaxUnpool: MaxPool's values scattered back to the positions its indices name, zeros elsewhere."""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._nn_util import as_float, float_np, static_shape
from edgebuild_coreml.lowering.registry import lowers


@lowers("MaxUnpool", since=9)
def max_unpool(ctx, node):
    x = as_float(ctx.input(node, 0))
    indices = ctx.input(node, 1)
    shape = static_shape(x)
    if shape is None or static_shape(indices) != shape:
        ctx.fail(node, "X and I need the same static shape", hint="pin the input shapes in the recipe's source.inputs")
    kernel = [int(k) for k in ctx.attr(node, "kernel_shape", [])]
    spatial = len(shape) - 2
    if len(kernel) != spatial:
        ctx.fail(node, f"kernel_shape {kernel} must have one entry per spatial dim ({spatial})")
    strides = [int(s) for s in ctx.attr(node, "strides", [1] * spatial)]
    pads = [int(p) for p in ctx.attr(node, "pads", [0] * 2 * spatial)]
    # The shape MaxPool came from; indices count positions in it, flattened over N, C and space.
    unpooled = list(shape[:2]) + [(shape[2 + d] - 1) * strides[d] - pads[d] - pads[spatial + d] + kernel[d]
                                  for d in range(spatial)]
    wanted = unpooled
    if ctx.has_input(node, 2):
        wanted = [int(v) for v in np.asarray(ctx.const(node, 2, what="output_shape")).reshape(-1)]
        if len(wanted) != len(shape) or any(w < u for w, u in zip(wanted, unpooled)):
            ctx.fail(node, f"output_shape {wanted} is smaller than the unpooled shape {unpooled}")
    zeros = np.zeros(int(np.prod(unpooled)), dtype=float_np(x))
    flat_indices = mb.reshape(x=indices, shape=np.array([-1], np.int32), name=ctx.name(node, "flat_indices"))
    flat_values = mb.reshape(x=x, shape=np.array([-1], np.int32), name=ctx.name(node, "flat_values"))
    scattered = mb.scatter(data=zeros, indices=flat_indices, updates=flat_values, axis=0, mode="update",
                           name=ctx.name(node, "scatter"))
    y = mb.reshape(x=scattered, shape=np.array(unpooled, np.int32),
                   name=ctx.name(node) if wanted == unpooled else ctx.name(node, "unpooled"))
    if wanted == unpooled:
        return y
    # A larger output_shape keeps the unpooled block at the origin, zeros after it.
    pad = [v for w, u in zip(wanted, unpooled) for v in (0, w - u)]
    return mb.pad(x=y, pad=np.array(pad, np.int32), mode="constant", constant_val=0.0, name=ctx.name(node))
