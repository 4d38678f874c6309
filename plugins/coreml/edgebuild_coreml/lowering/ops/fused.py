"""Ops of the "edgebuild" domain, produced by edgebuild's fusion passes."""

from __future__ import annotations

import math

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.context import target_index
from edgebuild_coreml.lowering.ops._nn_util import as_float, fconst, float_np, shape_of
from edgebuild_coreml.lowering.ops.attention import group_query_heads
from edgebuild_coreml.lowering.ops._util import is_static
from edgebuild_coreml.lowering.registry import lowers
from edgebuild_coreml.lowering.tied_embeddings import embedding_table

DOMAIN = "edgebuild"


@lowers("Linear", domain=DOMAIN)
def linear(ctx, node):
    """X @ W + B with W shaped [K, N] (MatMul's layout); MIL ``linear`` wants [N, K]."""
    x, w = as_float(ctx.input(node, 0)), as_float(ctx.input(node, 1))
    b = as_float(ctx.input(node, 2, optional=True))
    if isinstance(w, np.ndarray) and (b is None or isinstance(b, np.ndarray)):
        dtype = float_np(x)
        bias = np.zeros([w.shape[1]], dtype) if b is None else np.broadcast_to(b, [w.shape[1]]).astype(dtype)
        # A view of the (memory-mapped) initializer when the dtype already matches: the fp16 cast or
        # the serializer reads each weight once, instead of the program holding a copy of them all.
        weight = w.T.astype(dtype, copy=False)
        shared = embedding_table(weight) if b is None else None  # a tied LM head: the table stored once
        return mb.linear(x=x, weight=weight if shared is None else shared, bias=bias, name=ctx.name(node))
    product = mb.matmul(x=x, y=w, name=ctx.name(node) if b is None else ctx.name(node, "matmul"))
    return product if b is None else mb.add(x=product, y=b, name=ctx.name(node))


@lowers("Silu", domain=DOMAIN)
def silu(ctx, node):
    return mb.silu(x=as_float(ctx.input(node, 0)), name=ctx.name(node))


@lowers("Gelu", domain=DOMAIN)
def gelu(ctx, node):
    approximate = ctx.attr(node, "approximate", "none")
    approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
    modes = {"none": "EXACT", "tanh": "TANH_APPROXIMATION"}
    if approximate not in modes:
        ctx.fail(node, f"approximate={approximate!r}; expected 'none' or 'tanh'")
    return mb.gelu(x=as_float(ctx.input(node, 0)), mode=modes[approximate], name=ctx.name(node))


@lowers("ScaledDotProductAttention", domain=DOMAIN)
def scaled_dot_product_attention(ctx, node):
    q, k, v = (as_float(ctx.input(node, i)) for i in range(3))
    mask = as_float(ctx.input(node, 3, optional=True))
    heads = ctx.attr(node, "q_heads"), ctx.attr(node, "kv_heads")
    return scaled_dot_product(ctx, node, q, k, v, mask, ctx.attr(node, "scale"), name=ctx.name(node),
                              heads=heads if None not in heads else None)


def scaled_dot_product(ctx, node, q, k, v, mask, scale: float | None, *, name: str,
                       heads: tuple[int, int] | None = None):
    """softmax(Q K^T * scale + mask) V: the fused iOS18 op, or matmul/softmax before that.

    ``mask`` is additive (or None); ``scale`` None means 1/sqrt(head size). Shared with the
    com.microsoft attention lowerings (contrib_attention.py). K/V with fewer heads than Q
    (grouped-query attention) are attended per K/V head, never repeated; ``heads`` (query, K/V
    head counts) when the shapes do not tell them.
    """
    if heads is None and len(shape_of(q)) == 4 and len(shape_of(k)) == 4:
        heads = shape_of(q)[1], shape_of(k)[1]
        heads = heads if all(is_static(h) for h in heads) else None
    if heads is not None and heads[0] != heads[1]:
        grouped_q, grouped_mask, restore = group_query_heads(ctx, node, q, mask, heads[1], heads=heads[0])
        if grouped_mask is not None and isinstance(grouped_mask, np.ndarray):
            grouped_mask = grouped_mask.astype(float_np(q))
        scale = 1.0 / math.sqrt(shape_of(q)[-1]) if scale is None else scale
        y = scaled_dot_product(ctx, node, grouped_q, k, v, grouped_mask, scale, name=ctx.name_for(name, "grouped"))
        return mb.identity(x=restore(y), name=name)
    depth = shape_of(q)[-1]
    default_scale = 1.0 / math.sqrt(depth) if isinstance(depth, (int, np.integer)) else None
    scale = default_scale if scale is None else scale
    if scale is None:
        ctx.fail(node, "the head size is dynamic and no scale is given", "pin the input shapes in the recipe")
    scale = float(scale)
    if mask is not None and isinstance(mask, np.ndarray):
        mask = mask.astype(float_np(q))
    if target_index(ctx.target) >= target_index("iOS18") and default_scale is not None:
        if not math.isclose(scale, default_scale, rel_tol=1e-7):
            # MIL's op always divides by sqrt(D): fold the difference into Q.
            q = mb.mul(x=q, y=fconst(q, scale / default_scale), name=ctx.name_for(name, "q_scaled"))
        kwargs = {"attn_mask": mask} if mask is not None else {}
        return mb.scaled_dot_product_attention(query=q, key=k, value=v, name=name, **kwargs)
    scores = mb.matmul(x=q, y=k, transpose_y=True, name=ctx.name_for(name, "scores"))
    scores = mb.mul(x=scores, y=fconst(scores, scale), name=ctx.name_for(name, "scaled"))
    if mask is not None:
        scores = mb.add(x=scores, y=mask, name=ctx.name_for(name, "masked"))
    weights = mb.softmax(x=scores, axis=-1, name=ctx.name_for(name, "weights"))
    return mb.matmul(x=weights, y=v, name=name)
