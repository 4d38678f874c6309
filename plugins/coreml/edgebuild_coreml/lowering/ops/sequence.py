"""Ordering and running ops: Trilu, CumSum, TopK, ReverseSequence.

MIL's ``topk`` takes ``k`` as a compile-time constant. A TopK whose ``k`` is only known at run time
(detection heads keep ``min(N, count)`` of the scores that passed a threshold, and that count
comes from NonZero) sorts the whole axis and keeps the first ``k``: the same values and indices,
since ONNX's TopK returns them sorted.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import const_like, dim, dtype_of, normalize_axis, rank_of, to_var
from edgebuild_coreml.lowering.registry import lowers


@lowers("Trilu")
def trilu(ctx, node):
    """Keep elements with col - row >= k (upper) or <= k (lower); zero the rest."""
    x = ctx.input(node, 0)
    k = ctx.input(node, 1, optional=True)
    k = np.int32(0) if k is None else (mb.cast(x=k, dtype="int32") if dtype_of(k) != "int32" else k)
    if rank_of(x) < 2:
        ctx.fail(node, "needs a rank >= 2 input")
    rows = mb.expand_dims(x=mb.range_1d(start=np.int32(0), end=dim(x, -2), step=np.int32(1)), axes=[1])
    cols = mb.expand_dims(x=mb.range_1d(start=np.int32(0), end=dim(x, -1), step=np.int32(1)), axes=[0])
    offset = mb.sub(x=mb.sub(x=cols, y=rows), y=mb.reshape(x=k, shape=[1, 1]) if not isinstance(k, np.integer) else k)
    keep = mb.greater_equal(x=offset, y=np.int32(0)) if ctx.attr(node, "upper", 1) else mb.less_equal(x=offset, y=np.int32(0))
    zeros = const_like(0, x) if dtype_of(x) != "bool" else np.bool_(False)
    return mb.select(cond=keep, a=x, b=zeros, name=ctx.name(node))


@lowers("CumSum")
def cumsum(ctx, node):
    x = ctx.input(node, 0)
    axis = int(np.asarray(ctx.const(node, 1, what="axis")).reshape(-1)[0])
    axis = normalize_axis(ctx, node, axis, rank_of(x))
    return mb.cumsum(
        x=x, axis=axis, exclusive=bool(ctx.attr(node, "exclusive", 0)),
        reverse=bool(ctx.attr(node, "reverse", 0)), name=ctx.name(node),
    )


@lowers("TopK", until=9)
def topk_k_attribute(ctx, node):
    return _topk(ctx, node, int(ctx.attr(node, "k")))


@lowers("TopK", since=10)
def topk_k_input(ctx, node):
    k = ctx.const_value(node.inputs[1]) if ctx.has_input(node, 1) else None
    if k is None and ctx.has_input(node, 1):
        return _topk_runtime_k(ctx, node, ctx.input(node, 1))
    return _topk(ctx, node, int(np.asarray(ctx.const(node, 1, what="k")).reshape(-1)[0]))


def _topk(ctx, node, k: int):
    x = ctx.input(node, 0)
    axis = normalize_axis(ctx, node, int(ctx.attr(node, "axis", -1)), rank_of(x))
    largest = bool(ctx.attr(node, "largest", 1))
    values, indices = mb.topk(x=x, k=k, axis=axis, ascending=not largest, name=ctx.name(node))
    return values, indices


def _topk_runtime_k(ctx, node, k):
    """TopK with ``k`` computed at run time: the whole axis sorted, then its first ``k`` (clamped
    to the axis, which ONNX requires ``k`` not to exceed) by a slice whose end is a tensor."""
    x = to_var(ctx.input(node, 0))
    rank = rank_of(x)
    axis = normalize_axis(ctx, node, int(ctx.attr(node, "axis", -1)), rank)
    largest = bool(ctx.attr(node, "largest", 1))
    order = mb.argsort(x=x, axis=axis, ascending=not largest, name=ctx.name(node, "order"))
    ordered = mb.gather_along_axis(x=x, indices=order, axis=axis, name=ctx.name(node, "sorted"))
    if dtype_of(k) != "int32":
        k = mb.cast(x=k, dtype="int32", name=ctx.name(node, "k_int"))
    k = mb.reshape(x=k, shape=[1], name=ctx.name(node, "k_vector"))
    k = mb.minimum(x=k, y=mb.reshape(x=to_var(dim(x, axis)), shape=[1]), name=ctx.name(node, "k"))
    # the end is k on the sorted axis; every other axis is taken whole (its end masked)
    parts = [np.zeros(axis, np.int32), k, np.zeros(rank - axis - 1, np.int32)]
    end = mb.concat(values=[to_var(p) for p in parts if not isinstance(p, np.ndarray) or p.size], axis=0,
                    name=ctx.name(node, "end"))
    masks = [a != axis for a in range(rank)]
    begin = np.zeros(rank, np.int32)
    values = mb.slice_by_index(x=ordered, begin=begin, end=end, end_mask=masks, name=ctx.name(node))
    indices = mb.slice_by_index(x=order, begin=begin, end=end, end_mask=masks, name=ctx.name(node, "indices"))
    return values, indices


@lowers("ReverseSequence")
def reverse_sequence(ctx, node):
    x, lengths = ctx.input(node, 0), ctx.input(node, 1)
    if dtype_of(lengths) != "int32":
        lengths = mb.cast(x=lengths, dtype="int32")
    return mb.reverse_sequence(
        x=x, lengths=lengths, seq_axis=int(ctx.attr(node, "time_axis", 0)),
        batch_axis=int(ctx.attr(node, "batch_axis", 1)), name=ctx.name(node),
    )
