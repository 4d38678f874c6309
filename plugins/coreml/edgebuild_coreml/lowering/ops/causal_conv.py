"""CausalConvWithState (opset 27): a depthwise causal 1-D convolution continuing from a
carried state, unrolled into one multiply-add per kernel tap (the weight may be a runtime
tensor, which MIL conv does not take)."""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import is_static, numpy_dtype, dtype_of, rank_of, shape_of, wanted
from edgebuild_coreml.lowering.registry import lowers


@lowers("CausalConvWithState", since=27)
def causal_conv_with_state(ctx, node):
    x, weight = ctx.input(node, 0), ctx.input(node, 1)
    bias, past = ctx.input(node, 2, optional=True), ctx.input(node, 3, optional=True)
    if rank_of(x) != 3 or rank_of(weight) != 3:
        ctx.fail(node, "input must be (batch, channels, length) and weight (channels, 1, k)")
    if not all(is_static(d) for d in shape_of(x) + shape_of(weight)):
        ctx.fail(node, "needs static input and weight shapes", hint="pin the input shapes in the recipe")
    half = dtype_of(x) == "fp16"  # the reference computes in fp32 and rounds the results
    if half:
        x, weight = mb.cast(x=x, dtype="fp32"), mb.cast(x=weight, dtype="fp32")
        bias = mb.cast(x=bias, dtype="fp32") if bias is not None else None
        past = mb.cast(x=past, dtype="fp32") if past is not None else None
    batch, channels, length = shape_of(x)
    taps = shape_of(weight)[2]
    activation = ctx.attr(node, "activation", "none")
    activation = activation.decode() if isinstance(activation, bytes) else activation
    if activation not in ("none", "silu", "swish"):
        ctx.fail(node, f"activation {activation!r} is not one of none, silu, swish")
    if taps > 1:
        history = past if past is not None else np.zeros((batch, channels, taps - 1), numpy_dtype(dtype_of(x)))
        padded = mb.concat(values=[history, x], axis=2)
    else:
        padded = x
    kernel = mb.reshape(x=weight, shape=[channels, taps])
    out = None
    for tap in range(taps):
        window = mb.slice_by_index(x=padded, begin=[0, 0, tap], end=[batch, channels, tap + length])
        term = mb.mul(x=window, y=mb.slice_by_index(x=kernel, begin=[0, tap], end=[channels, tap + 1]))
        out = term if out is None else mb.add(x=out, y=term)
    if bias is not None:
        out = mb.add(x=out, y=mb.reshape(x=bias, shape=[channels, 1]))
    if activation != "none":
        out = mb.mul(x=out, y=mb.sigmoid(x=out))
    out = mb.cast(x=out, dtype="fp16", name=ctx.name(node)) if half else mb.identity(x=out, name=ctx.name(node))
    if len(node.outputs) < 2 or not wanted(node.outputs[1]):
        return out
    if taps == 1:
        ctx.fail(node, "a kernel of size 1 carries an empty state, which Core ML cannot hold")
    total = length + taps - 1
    state = mb.slice_by_index(x=padded, begin=[0, 0, total - (taps - 1)], end=[batch, channels, total])
    return out, mb.cast(x=state, dtype="fp16") if half else state
