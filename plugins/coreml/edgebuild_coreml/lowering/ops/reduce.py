"""Reductions (ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare), ArgMax, ArgMin.

Axes moved from an attribute to an optional input at opset 13 for ReduceSum and at 18 for
the rest: each reduction registers one lowering per side of that change. With no axes, ONNX
reduces everything unless ``noop_with_empty_axes`` is set.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import (
    axes_attribute,
    axes_input,
    dim,
    dtype_of,
    normalize_axis,
    rank_of,
    shape_of,
)
from edgebuild_coreml.lowering.registry import lowers

_REDUCERS = {
    "ReduceSum": mb.reduce_sum,
    "ReduceMean": mb.reduce_mean,
    "ReduceMax": mb.reduce_max,
    "ReduceMin": mb.reduce_min,
    "ReduceProd": mb.reduce_prod,
    "ReduceL1": mb.reduce_l1_norm,
    "ReduceL2": mb.reduce_l2_norm,
    "ReduceLogSum": mb.reduce_log_sum,
    "ReduceLogSumExp": mb.reduce_log_sum_exp,
    "ReduceSumSquare": mb.reduce_sum_square,
}


_REST = tuple(op_type for op_type in _REDUCERS if op_type != "ReduceSum")


@lowers("ReduceSum", until=12)
@lowers(*_REST, until=17)
def reduce_axes_attribute(ctx, node):
    return _reduce(ctx, node, axes_attribute(ctx, node))


@lowers("ReduceSum", since=13)
@lowers(*_REST, since=18)
def reduce_axes_input(ctx, node):
    return _reduce(ctx, node, axes_input(ctx, node))


def _reduce(ctx, node, axes):
    x = ctx.input(node, 0)
    keep_dims = bool(ctx.attr(node, "keepdims", 1))
    if not axes:
        if ctx.attr(node, "noop_with_empty_axes", 0):
            return mb.identity(x=x, name=ctx.name(node))
        axes = None
    rank = rank_of(x)
    if rank == 0:  # a scalar reduces to itself
        return mb.identity(x=x, name=ctx.name(node))
    if axes is not None:
        axes = sorted({normalize_axis(ctx, node, a, rank) for a in axes})
    if 0 in shape_of(x):
        ctx.fail(node, "reducing an empty tensor is not supported: Core ML tensors have no zero-size dims")
    if dtype_of(x) == "bool":  # Max/Min of booleans are any/all: reduce as int32, cast back
        if node.op_type not in ("ReduceMax", "ReduceMin"):
            ctx.fail(node, f"{node.op_type} of a boolean tensor is not defined")
        counted = _REDUCERS[node.op_type](x=mb.cast(x=x, dtype="int32"), axes=axes, keep_dims=keep_dims)
        return mb.cast(x=counted, dtype="bool", name=ctx.name(node))
    return _REDUCERS[node.op_type](x=x, axes=axes, keep_dims=keep_dims, name=ctx.name(node))


@lowers("ArgMax", "ArgMin")
def arg_reduce(ctx, node):
    x = ctx.input(node, 0)
    axis = normalize_axis(ctx, node, int(ctx.attr(node, "axis", 0)), rank_of(x))
    keep_dims = bool(ctx.attr(node, "keepdims", 1))
    reducer = mb.reduce_argmax if node.op_type == "ArgMax" else mb.reduce_argmin
    if not ctx.attr(node, "select_last_index", 0):
        return reducer(x=x, axis=axis, keep_dims=keep_dims, name=ctx.name(node))
    # Last index among ties: search the reversed axis (first hit = last original), map back.
    found = reducer(x=mb.reverse(x=x, axes=[axis]), axis=axis, keep_dims=keep_dims, name=ctx.name(node, "rev"))
    last = mb.sub(x=dim(x, axis), y=np.int32(1))
    return mb.sub(x=last, y=found, name=ctx.name(node))
