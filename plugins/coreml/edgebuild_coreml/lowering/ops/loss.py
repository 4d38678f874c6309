"""Classification losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both pick, per sample, the score of the target class along axis 1 (gather_along_axis),
weight it by the class weight, zero the samples whose target is ``ignore_index``, then
reduce: ``none`` keeps the per-sample losses, ``sum`` adds them, ``mean`` divides the sum
by the total weight of the samples that count (ONNX's weighted mean).
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import dtype_of, rank_of, wanted
from edgebuild_coreml.lowering.registry import lowers

_REDUCTIONS = ("none", "sum", "mean")


def _as_int32(x):
    return x if dtype_of(x) == "int32" else mb.cast(x=x, dtype="int32")


def _nll(ctx, node, log_prob, target, weight):
    """The reduced negative log-likelihood of ``log_prob`` [N, C, ...] at ``target`` [N, ...]."""
    reduction = ctx.attr(node, "reduction", "mean")
    if reduction not in _REDUCTIONS:
        ctx.fail(node, f"reduction {reduction!r} is not one of {', '.join(_REDUCTIONS)}")
    if rank_of(log_prob) < 2:
        ctx.fail(node, "the scores need a rank of at least 2 (N, C, ...)")
    target = _as_int32(target)
    ignore_index = ctx.attr(node, "ignore_index")
    counts = None
    if ignore_index is not None:
        ignored = mb.equal(x=target, y=np.int32(ignore_index))
        target = mb.select(cond=ignored, a=np.int32(0), b=target)  # any valid class; zeroed below
        counts = mb.cast(x=mb.logical_not(x=ignored), dtype=dtype_of(log_prob))
    picked = mb.gather_along_axis(x=log_prob, indices=mb.expand_dims(x=target, axes=[1]), axis=1)
    picked = mb.squeeze(x=picked, axes=[1])
    sample_weight = mb.gather(x=weight, indices=target, axis=0) if weight is not None else None
    if counts is not None:
        sample_weight = counts if sample_weight is None else mb.mul(x=sample_weight, y=counts)
    loss = mb.mul(x=picked, y=np.array(-1.0, dtype=np.float32 if dtype_of(log_prob) == "fp32" else np.float16))
    if sample_weight is not None:
        loss = mb.mul(x=loss, y=sample_weight)
    if reduction == "none":
        return mb.identity(x=loss, name=ctx.name(node))
    total = mb.reduce_sum(x=loss, axes=None, keep_dims=False)
    if reduction == "sum":
        return mb.identity(x=total, name=ctx.name(node))
    if sample_weight is None:
        return mb.reduce_mean(x=loss, axes=None, keep_dims=False, name=ctx.name(node))
    return mb.real_div(x=total, y=mb.reduce_sum(x=sample_weight, axes=None, keep_dims=False), name=ctx.name(node))


@lowers("NegativeLogLikelihoodLoss", since=12)
def negative_log_likelihood_loss(ctx, node):
    weight = ctx.input(node, 2, optional=True)
    return _nll(ctx, node, ctx.input(node, 0), ctx.input(node, 1), weight)


@lowers("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy_loss(ctx, node):
    scores = ctx.input(node, 0)
    # log-softmax over the class axis, stably: x - logsumexp(x)
    log_prob = mb.sub(x=scores, y=mb.reduce_log_sum_exp(x=scores, axes=[1], keep_dims=True),
                      name=ctx.name(node, "log_prob"))
    loss = _nll(ctx, node, log_prob, ctx.input(node, 1), ctx.input(node, 2, optional=True))
    return (loss, log_prob) if len(node.outputs) > 1 and wanted(node.outputs[1]) else loss
