"""FusedMatMul: alpha * op(A) @ op(B), numpy-style batching, from onnxruntime's optimiser.

op() transposes the last two axes (transA / transB) and, with transBatchA / transBatchB,
first moves axis 0 to just before the last axis ([d0, d1, .., dn-2, dn-1] ->
[d1, .., dn-2, d0, dn-1]), as onnxruntime's kernel reads the operand.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._nn_util import as_float, fconst, float_np, rank_of
from edgebuild_coreml.lowering.ops.gemm import vectors_as_matrices
from edgebuild_coreml.lowering.registry import lowers

DOMAIN = "com.microsoft"


def _batch_transposed(ctx, node, x, what: str):
    rank = rank_of(x)
    perm = [*range(1, rank - 1), 0, rank - 1]
    if isinstance(x, np.ndarray):
        return np.transpose(x, perm)
    return mb.transpose(x=x, perm=perm, name=ctx.name(node, f"{what}_batch_transposed"))


@lowers("FusedMatMul", domain=DOMAIN)
def fused_matmul(ctx, node):
    a, b = as_float(ctx.input(node, 0)), as_float(ctx.input(node, 1))
    alpha = float(ctx.attr(node, "alpha", 1.0))
    trans_a, trans_b = bool(ctx.attr(node, "transA", 0)), bool(ctx.attr(node, "transB", 0))
    batch_a, batch_b = bool(ctx.attr(node, "transBatchA", 0)), bool(ctx.attr(node, "transBatchB", 0))
    rank_a, rank_b = rank_of(a), rank_of(b)
    if (batch_a or batch_b) and not (rank_a == rank_b >= 3):
        ctx.fail(node, f"transBatchA/transBatchB need inputs of one rank >= 3; they have ranks {rank_a} and {rank_b}")
    if min(rank_a, rank_b) == 1:
        return _with_vector(ctx, node, a, b, trans_a, trans_b, alpha)
    if batch_a:
        a = _batch_transposed(ctx, node, a, "A")
    if batch_b:
        b = _batch_transposed(ctx, node, b, "B")
    if isinstance(b, np.ndarray) and b.ndim == 2 and not isinstance(a, np.ndarray) and not trans_a and rank_a <= 3:
        # a constant B is MIL ``linear`` (weight [N, K], x of rank <= 3) with alpha folded in, as Gemm does
        weight = (b if trans_b else b.T) * alpha
        dtype = float_np(a)
        return mb.linear(x=a, weight=weight.astype(dtype), bias=np.zeros([weight.shape[0]], dtype), name=ctx.name(node))
    last = alpha == 1.0
    product = mb.matmul(x=a, y=b, transpose_x=trans_a, transpose_y=trans_b,
                        name=ctx.name(node) if last else ctx.name(node, "matmul"))
    return product if last else mb.mul(x=product, y=fconst(product, alpha), name=ctx.name(node))


def _with_vector(ctx, node, a, b, trans_a: bool, trans_b: bool, alpha: float):
    """numpy's 1-D rules: a vector operand gains a unit axis, squeezed out of the product."""
    if (rank_of(a) == 1 and trans_a) or (rank_of(b) == 1 and trans_b):
        ctx.fail(node, "transA/transB on a 1-D input is not supported", "reshape the vector to a matrix")
    a, b, squeeze = vectors_as_matrices(ctx, node, a, b)
    product = mb.matmul(x=a, y=b, transpose_x=trans_a, transpose_y=trans_b, name=ctx.name(node, "2d"))
    if alpha != 1.0:
        product = mb.mul(x=product, y=fconst(product, alpha), name=ctx.name(node, "alpha"))
    return mb.squeeze(x=product, axes=squeeze, name=ctx.name(node))
