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
    # The shape MaxPool came from: output_shape when given (MaxPool's input may have had a row or
    # column no window reached), else the smallest shape these windows cover. The indices count
    # positions in it, flattened over N, C and space (onnxruntime's and torch's reading; the ONNX
    # reference instead scatters into the smallest shape and pads: see docs/op-notes.md).
    shape_out = list(shape[:2]) + [(shape[2 + d] - 1) * strides[d] - pads[d] - pads[spatial + d] + kernel[d]
                                   for d in range(spatial)]
    if ctx.has_input(node, 2):
        given = [int(v) for v in np.asarray(ctx.const(node, 2, what="output_shape")).reshape(-1)]
        if len(given) != len(shape) or given[:2] != list(shape[:2]):
            ctx.fail(node, f"output_shape {given} must be [N, C, ...] of X's N and C {list(shape[:2])}")
        shape_out = given
    zeros = np.zeros(int(np.prod(shape_out)), dtype=float_np(x))
    flat_indices = mb.reshape(x=indices, shape=np.array([-1], np.int32), name=ctx.name(node, "flat_indices"))
    flat_values = mb.reshape(x=x, shape=np.array([-1], np.int32), name=ctx.name(node, "flat_values"))
    scattered = mb.scatter(data=zeros, indices=flat_indices, updates=flat_values, axis=0, mode="update",
                           name=ctx.name(node, "scatter"))
    return mb.reshape(x=scattered, shape=np.array(shape_out, np.int32), name=ctx.name(node))
