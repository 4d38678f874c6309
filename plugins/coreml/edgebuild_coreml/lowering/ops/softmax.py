"""Softmax, LogSoftmax, Hardmax.

Before opset 13 these ops flatten the input to 2-D at ``axis`` (default 1) and normalise
over everything from ``axis`` on; from 13 they normalise over the single ``axis``
(default -1). The coerced form is lowered as reshape -> op on the last axis -> reshape.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._nn_util import as_float, float_np, rank_of, static_shape
from edgebuild_coreml.lowering.registry import lowers


def _softmax(x, axis, name):
    return mb.softmax(x=x, axis=axis, name=name)


def _log_softmax(x, axis, name):
    """x - logsumexp(x): stable, unlike log(softmax(x))."""
    total = mb.reduce_log_sum_exp(x=x, axes=[axis], keep_dims=True, name=name + "_lse")
    return mb.sub(x=x, y=total, name=name)


def _hardmax(x, axis, name):
    """One-hot of the first maximum along ``axis``."""
    size = static_shape(x)
    if size is None or size[axis] is None:
        raise ValueError("hardmax needs a static size along its axis")
    index = mb.reduce_argmax(x=x, axis=axis, keep_dims=False, name=name + "_argmax")
    one = np.asarray(1, float_np(x))
    zero = np.asarray(0, float_np(x))
    return mb.one_hot(
        indices=index, one_hot_vector_size=int(size[axis]), axis=axis, on_value=one, off_value=zero, name=name
    )


_KERNELS = {"Softmax": _softmax, "LogSoftmax": _log_softmax, "Hardmax": _hardmax}


@lowers("Softmax", "LogSoftmax", "Hardmax", until=12)
def softmax_family_flattened(ctx, node):
    x, axis = _operands(ctx, node, default_axis=1)
    if axis == rank_of(x) - 1:
        return _along(ctx, node, x, axis)
    shape = static_shape(x)
    if shape is None:
        ctx.fail(node, f"{node.op_type} before opset 13 flattens dims {axis}.. to one axis, which needs static shapes",
                 "pin the input shapes in the recipe or update the model to opset 13")
    inner = int(np.prod(shape[axis:]))
    flat = mb.reshape(x=x, shape=[-1, inner], name=ctx.name(node, "flat"))
    result = _KERNELS[node.op_type](flat, 1, ctx.name(node, "2d"))
    return mb.reshape(x=result, shape=list(shape), name=ctx.name(node))


@lowers("Softmax", "LogSoftmax", "Hardmax", since=13)
def softmax_family(ctx, node):
    return _along(ctx, node, *_operands(ctx, node, default_axis=-1))


def _operands(ctx, node, default_axis: int):
    """(x as float, ``axis`` made non-negative and checked)."""
    x = as_float(ctx.input(node, 0))
    rank = rank_of(x)
    axis = int(ctx.attr(node, "axis", default_axis))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < max(rank, 1):
        ctx.fail(node, f"axis {axis} is out of range for a rank-{rank} input")
    return x, axis


def _along(ctx, node, x, axis: int):
    try:
        return _KERNELS[node.op_type](x, axis, ctx.name(node))
    except ValueError as err:
        ctx.fail(node, str(err), "pin the input shapes in the recipe")
