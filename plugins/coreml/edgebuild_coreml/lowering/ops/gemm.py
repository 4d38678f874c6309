"""Gemm, MatMul and MatMulInteger onto MIL ``linear`` / ``matmul``."""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._nn_util import as_float, fconst, float_np, rank_of
from edgebuild_coreml.lowering.registry import lowers


def _bias_vector(c, n: int) -> np.ndarray | None:
    """C as a [N] vector when it only varies along N (what ``linear``'s bias can hold)."""
    c = np.asarray(c)
    if c.size == 1:
        return np.full([n], c.reshape(()), dtype=np.float32)
    if c.ndim == 1 and c.shape[0] == n:
        return c.astype(np.float32)
    if c.ndim == 2 and c.shape == (1, n):
        return c.reshape(n).astype(np.float32)
    return None


@lowers("Gemm")
def gemm(ctx, node):
    """Y = alpha * A' @ B' + beta * C; a constant B becomes ``linear`` with alpha, beta folded in."""
    a, b = as_float(ctx.input(node, 0)), as_float(ctx.input(node, 1))
    c = as_float(ctx.input(node, 2, optional=True))
    alpha, beta = float(ctx.attr(node, "alpha", 1.0)), float(ctx.attr(node, "beta", 1.0))
    trans_a, trans_b = bool(ctx.attr(node, "transA", 0)), bool(ctx.attr(node, "transB", 0))

    if isinstance(b, np.ndarray) and not isinstance(a, np.ndarray) and not trans_a:
        weight = (b if trans_b else b.T) * alpha  # linear wants [N, K]
        n = weight.shape[0]
        bias = None
        if c is None:
            bias = np.zeros([n], np.float32)
        elif isinstance(c, np.ndarray):
            bias = _bias_vector(c * beta, n)
        if bias is not None:
            dtype = float_np(a)
            return mb.linear(x=a, weight=weight.astype(dtype), bias=bias.astype(dtype), name=ctx.name(node))

    last = c is None or (beta == 0.0)
    product = mb.matmul(x=a, y=b, transpose_x=trans_a, transpose_y=trans_b,
                        name=ctx.name(node) if last and alpha == 1.0 else ctx.name(node, "matmul"))
    if alpha != 1.0:
        product = mb.mul(x=product, y=fconst(product, alpha), name=ctx.name(node) if last else ctx.name(node, "alpha"))
    if last:
        return product
    if isinstance(c, np.ndarray):
        return mb.add(x=product, y=(c * beta).astype(float_np(product)), name=ctx.name(node))
    if beta != 1.0:
        c = mb.mul(x=c, y=fconst(c, beta), name=ctx.name(node, "beta"))
    return mb.add(x=product, y=c, name=ctx.name(node))


def vectors_as_matrices(ctx, node, a, b):
    """numpy's 1-D matmul rules: a vector operand gains a unit axis; returns (a, b, the axes to
    squeeze out of the product)."""
    squeeze = []
    if rank_of(a) == 1:
        a = a.reshape(1, -1) if isinstance(a, np.ndarray) else mb.expand_dims(x=a, axes=[0], name=ctx.name(node, "a2d"))
        squeeze.append(-2)
    if rank_of(b) == 1:
        b = b.reshape(-1, 1) if isinstance(b, np.ndarray) else mb.expand_dims(x=b, axes=[1], name=ctx.name(node, "b2d"))
        squeeze = [-1] if not squeeze else [-2, -1]
    return a, b, squeeze


@lowers("MatMul")
def matmul(ctx, node):
    a, b = as_float(ctx.input(node, 0)), as_float(ctx.input(node, 1))
    if isinstance(b, np.ndarray) and not isinstance(a, np.ndarray) and b.ndim == 2 and rank_of(a) >= 2:
        # x @ W with a constant W is MIL ``linear`` (weight [N, K]), which the ANE prefers.
        dtype = float_np(a) if b.dtype.kind == "f" else b.dtype
        if b.dtype.kind == "f":
            # A view of the (memory-mapped) initializer when the dtype already matches: the fp16
            # cast or the serializer reads it once, instead of the program holding a copy.
            weight = b.T.astype(dtype, copy=False)
            return mb.linear(x=a, weight=weight, bias=np.zeros([b.shape[1]], dtype), name=ctx.name(node))
    if isinstance(a, np.ndarray) and a.dtype.kind in "iu":
        a = ctx.int32(a, node, "A")
    if isinstance(b, np.ndarray) and b.dtype.kind in "iu":
        b = ctx.int32(b, node, "B")
    a, b, squeeze = vectors_as_matrices(ctx, node, a, b)
    if not squeeze:
        return mb.matmul(x=a, y=b, name=ctx.name(node))
    product = mb.matmul(x=a, y=b, name=ctx.name(node, "2d"))
    return mb.squeeze(x=product, axes=squeeze, name=ctx.name(node))


def _centred_int32(ctx, node, index: int, zero_index: int, what: str):
    """Input ``index`` as int32 minus its zero point (per-tensor or per-row/column)."""
    x = ctx.input(node, index)
    x = ctx.int32(x, node, what) if isinstance(x, np.ndarray) else mb.cast(x=x, dtype="int32", name=ctx.name(node, what))
    zero = ctx.input(node, zero_index, optional=True)
    if zero is None:
        return x
    if not isinstance(zero, np.ndarray):
        zero = mb.cast(x=zero, dtype="int32", name=ctx.name(node, what + "_zp"))
    else:
        zero = zero.astype(np.int32)
        if not zero.any():
            return x
        if what == "A" and zero.ndim == 1 and zero.size > 1:
            zero = zero.reshape(-1, 1)  # per-row zero point of A
    if isinstance(x, np.ndarray) and isinstance(zero, np.ndarray):
        return (x - zero).astype(np.int32)
    return mb.sub(x=x, y=zero, name=ctx.name(node, what + "_centred"))


@lowers("MatMulInteger", since=10)
def matmul_integer(ctx, node):
    """(A - a_zero) @ (B - b_zero) accumulated in int32, as ONNX specifies."""
    a = _centred_int32(ctx, node, 0, 2, "A")
    b = _centred_int32(ctx, node, 1, 3, "B")
    return mb.matmul(x=a, y=b, name=ctx.name(node))
