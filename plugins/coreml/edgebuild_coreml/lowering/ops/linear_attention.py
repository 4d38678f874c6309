"""LinearAttention (opset 27), unrolled over the (static) sequence: the recurrent state
S (B, H_kv, d_k, d_v) is updated once per token by the chosen rule —

    linear:       S += k v^T
    gated:        S = exp(g) S + k v^T
    delta:        S += k (beta (v - S^T k))^T
    gated_delta:  S = exp(g) S, then the delta update

— and each token reads ``scale * q^T S`` (KV heads shared by groups of query heads).
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import dtype_of, is_static, numpy_dtype, rank_of, shape_of, wanted
from edgebuild_coreml.lowering.ops.attention import repeat_heads, split_heads
from edgebuild_coreml.lowering.registry import lowers

MAX_UNROLLED = 128
_RULES = ("linear", "gated", "delta", "gated_delta")


def _per_token(x, t: int):
    """x[:, :, t:t+1, :] of a (B, H, T, D) tensor."""
    batch, heads, _, size = shape_of(x)
    return mb.slice_by_index(x=x, begin=[0, 0, t, 0], end=[batch, heads, t + 1, size])


def _gate_heads(x, heads: int):
    """(B, T, heads*D or heads or 1) -> (B, heads', T, D') with D' the per-head width."""
    batch, length, width = shape_of(x)
    groups = heads if width % heads == 0 and width >= heads else width
    split = mb.reshape(x=x, shape=[batch, length, groups, width // groups])
    return mb.transpose(x=split, perm=[0, 2, 1, 3])


@lowers("LinearAttention", since=27)
def linear_attention(ctx, node):
    query, key, value = ctx.input(node, 0), ctx.input(node, 1), ctx.input(node, 2)
    past, decay, beta = (ctx.input(node, i, optional=True) for i in (3, 4, 5))
    rule = ctx.attr(node, "update_rule", "gated_delta")
    rule = rule.decode() if isinstance(rule, bytes) else rule
    if rule not in _RULES:
        ctx.fail(node, f"update_rule {rule!r} is not one of {', '.join(_RULES)}")
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gating and decay is None or delta and beta is None:
        ctx.fail(node, f"update_rule {rule!r} needs the {'decay' if gating and decay is None else 'beta'} input")
    q_heads, kv_heads = ctx.attr(node, "q_num_heads"), ctx.attr(node, "kv_num_heads")
    if not q_heads or not kv_heads or q_heads % kv_heads:
        ctx.fail(node, "q_num_heads must be a positive multiple of kv_num_heads")
    for x in (query, key, value):
        if rank_of(x) != 3 or not all(is_static(d) for d in shape_of(x)):
            ctx.fail(node, "query/key/value must be (B, T, H*D) with static shapes")
    half = dtype_of(query) == "fp16"  # the reference computes in fp32 and rounds the results
    if half:
        query, key, value, past, decay, beta = (
            mb.cast(x=x, dtype="fp32") if x is not None else None for x in (query, key, value, past, decay, beta))
    batch, length, _ = shape_of(query)
    if length > MAX_UNROLLED:
        ctx.fail(node, f"sequences longer than {MAX_UNROLLED} tokens are not unrolled")
    q, k, v = split_heads(ctx, node, query, q_heads, "query"), split_heads(ctx, node, key, kv_heads, "key"), \
        split_heads(ctx, node, value, kv_heads, "value")
    d_k, d_v = shape_of(k)[3], shape_of(v)[3]
    dtype = numpy_dtype(dtype_of(q))
    scale = ctx.attr(node, "scale")
    scale = float(scale) if scale else 1.0 / np.sqrt(d_k)
    gates = _gate_heads(decay, kv_heads) if gating else None
    rates = _gate_heads(beta, kv_heads) if delta else None

    state = past if past is not None else np.zeros((batch, kv_heads, d_k, d_v), dtype)
    outputs = []
    for t in range(length):
        k_t, v_t = _per_token(k, t), _per_token(v, t)  # (B, H_kv, 1, d)
        if gating:  # exp(g) scales rows of S: (B, H_kv, d_k or 1, 1)
            state = mb.mul(x=state, y=mb.exp(x=mb.transpose(x=_per_token(gates, t), perm=[0, 1, 3, 2])))
        if delta:
            retrieved = mb.matmul(x=k_t, y=state)  # (B, H_kv, 1, d_v)
            v_t = mb.mul(x=_per_token(rates, t), y=mb.sub(x=v_t, y=retrieved))
        state = mb.add(x=state, y=mb.matmul(x=k_t, y=v_t, transpose_x=True))
        read = mb.matmul(x=_per_token(q, t), y=repeat_heads(state, q_heads // kv_heads))
        outputs.append(mb.mul(x=read, y=np.array(scale, dtype)))
    y = outputs[0] if length == 1 else mb.concat(values=outputs, axis=2)  # (B, H_q, T, d_v)
    y = mb.reshape(x=mb.transpose(x=y, perm=[0, 2, 1, 3]), shape=[batch, length, q_heads * d_v])
    y = mb.cast(x=y, dtype="fp16", name=ctx.name(node)) if half else mb.identity(x=y, name=ctx.name(node))
    if len(node.outputs) > 1 and wanted(node.outputs[1]):
        return y, mb.cast(x=state, dtype="fp16") if half else mb.identity(x=state, name=ctx.name(node, "state"))
    return y
