"""onnxruntime's fused attention ops (com.microsoft): Attention, MultiHeadAttention,
GroupQueryAttention — what onnxruntime.transformers' optimiser and GQA exports emit.

Each gathers Q, K, V as (batch, heads, length, head_size), builds one additive bias from
its masks (padding, causal, window, attention_bias), and attends through
:func:`attend`: the fused ``scaled_dot_product_attention`` (iOS18) where nothing else is
needed, an explicit matmul/softmax where soft-capping, a softmax sink or the QK output is.
Masks follow onnxruntime's CPU kernels: a padded key gets ``mask_filter_value`` (-10000 by
default) added to its score, a causal / out-of-window one is hidden entirely.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import (
    dtype_of,
    is_static,
    numpy_dtype,
    dim,
    rank_of,
    select,
    shape_of,
    to_var,
    wanted,
)
from edgebuild_coreml.lowering.ops.attention import (
    add_bias,
    merge_heads,
    grouped_matmul,
    position_bias,
    scaled_scores,
    split_heads,
)
from edgebuild_coreml.lowering.ops.fused import scaled_dot_product
from edgebuild_coreml.lowering.ops.rotary import gather_positions, rotate
from edgebuild_coreml.lowering.registry import lowers

MS = "com.microsoft"
DEFAULT_MASK_FILTER = -10000.0


# -- shared pieces ----------------------------------------------------------------------------
def attend(ctx, node, q, k, v, *, scale: float | None, bias=None, softcap: float = 0.0, sink=None, keep=False):
    """softmax(Q K^T * scale [soft-capped] + bias [, sink]) V for (B, N, S, D) Q and (B, N_kv, T, D)
    K/V. Returns (output (B, N, S, Dv), (scores, biased scores, probabilities) when ``keep``).

    ``sink``: an extra logit per head (N,), or 0.0, that joins the softmax's denominator only
    (onnxruntime's smooth softmax / head_sink)."""
    heads, kv_heads = shape_of(q)[1], shape_of(k)[1]
    if heads % kv_heads:
        ctx.fail(node, f"{heads} query heads cannot share {kv_heads} key/value heads evenly")
    # K/V stay at N_kv heads: the matmuls group the query heads per K/V head (no repeated copies)
    scale = 1.0 / np.sqrt(shape_of(q)[-1]) if scale is None else float(scale)
    if not softcap and sink is None and not keep:
        return scaled_dot_product(ctx, node, q, k, v, bias, scale, name=ctx.name(node, "attention")), None
    dtype = numpy_dtype(dtype_of(q))
    scores = scaled_scores(q, k, scale, softcap)
    biased = add_bias(scores, bias) if bias is not None else scores
    if sink is None:
        probabilities = mb.softmax(x=biased, axis=-1)
    else:
        batch, _, length, _ = shape_of(biased)
        column = np.broadcast_to(np.asarray(sink, dtype).reshape(1, -1, 1, 1), (batch, heads, length, 1))
        widened = mb.softmax(x=mb.concat(values=[biased, np.ascontiguousarray(column)], axis=-1), axis=-1)
        probabilities = mb.slice_by_index(x=widened, begin=[0, 0, 0, 0], end=list(shape_of(biased)))
    return grouped_matmul(probabilities, v), (scores, biased, probabilities)


def _require_static(ctx, node, *values):
    for x in values:
        if x is not None and not all(is_static(d) for d in shape_of(x)):
            ctx.fail(node, "needs static input shapes", hint="pin the input shapes in the recipe")


def _refuse_input(ctx, node, index: int, name: str, why: str):
    if ctx.has_input(node, index):
        ctx.fail(node, f"input {index} ({name}) is not supported: {why}")


def _as_int32(x):
    if isinstance(x, np.ndarray):
        return x.astype(np.int32)
    return x if dtype_of(x) == "int32" else mb.cast(x=x, dtype="int32")


def _where_visible(visible, filter_value: float, dtype):
    """0 where ``visible`` (a bool Var), ``filter_value`` elsewhere."""
    return select(visible, np.array(0, dtype), np.array(filter_value, dtype))


def padding_bias(ctx, node, mask, *, batch: int, q_length: int, total: int, filter_value: float, dtype, what: str):
    """An int32 key mask in onnxruntime's forms as an additive (B, 1, S or 1, T) bias:
    (B) key lengths (right padding), (2B) end positions then start positions (left padding),
    (B, T) or (B, S, T) raw 1 = attend / 0 = padding. Constant masks fold at build time."""
    mask = to_var(_as_int32(mask))
    shape = tuple(shape_of(mask))
    positions = np.arange(total, dtype=np.int32)
    if shape in ((batch,), (2 * batch,)):
        ends = mb.reshape(x=mb.slice_by_size(x=mask, begin=[0], size=[batch]), shape=[batch, 1])
        visible = mb.less(x=positions, y=ends)
        if shape[0] == 2 * batch:
            starts = mb.reshape(x=mb.slice_by_size(x=mask, begin=[batch], size=[batch]), shape=[batch, 1])
            visible = mb.logical_and(x=visible, y=mb.greater_equal(x=positions, y=starts))
        return mb.reshape(x=_where_visible(visible, filter_value, dtype), shape=[batch, 1, 1, total])
    if shape in ((batch, total), (batch, q_length, total)):
        bias = _where_visible(mb.greater(x=mask, y=np.int32(0)), filter_value, dtype)
        return mb.reshape(x=bias, shape=[batch, 1, 1 if len(shape) == 2 else q_length, total])
    ctx.fail(
        node,
        f"{what} of shape {shape} is not supported; expected ({batch},) key lengths, ({2 * batch},) end/start "
        f"positions, ({batch}, {total}) or ({batch}, {q_length}, {total}) 0/1 masks",
        hint="the (3*batch+2) and 4-D Megatron forms are not supported (onnxruntime's CPU kernel refuses them too)",
    )


def _float_input(ctx, node, index: int, dtype):
    x = ctx.input(node, index, optional=True)
    if x is None:
        return None
    if isinstance(x, np.ndarray):
        return x.astype(dtype)
    target = dtype_of(np.zeros(1, dtype))
    return x if dtype_of(x) == target else mb.cast(x=x, dtype=target)


def _attention_bias(ctx, node, index: int, dtype, q_length: int, total: int):
    """attention_bias (B or 1, N or 1, S, T), added to the scaled scores."""
    bias = _float_input(ctx, node, index, dtype)
    if bias is not None and (rank_of(bias) != 4 or tuple(shape_of(bias)[2:]) != (q_length, total)):
        expected = f"(B or 1, N or 1, {q_length}, {total})"
        ctx.fail(node, f"attention_bias has shape {tuple(shape_of(bias))}; expected {expected}")
    return bias


def _projection(x, weight, bias, begin: int, end: int):
    """x @ weight[:, begin:end] + bias[begin:end]: a linear layer when the weights are constant."""
    if isinstance(weight, np.ndarray) and (bias is None or isinstance(bias, np.ndarray)):
        dtype = numpy_dtype(dtype_of(x))
        w = np.ascontiguousarray(weight[:, begin:end].T).astype(dtype)
        b = np.zeros(end - begin, dtype) if bias is None else bias[begin:end].astype(dtype)
        return mb.linear(x=x, weight=w, bias=b)
    product = mb.matmul(x=x, y=mb.slice_by_index(x=weight, begin=[0, begin], end=[shape_of(weight)[0], end]))
    if bias is None:
        return product
    return mb.add(x=product, y=_bias_slice(bias, begin, end))


def _take(x, axis: int, index: int):
    """x[..., index, ...] along ``axis``, that axis dropped."""
    begin, end = [0] * rank_of(x), list(shape_of(x))
    begin[axis], end[axis] = index, index + 1
    return mb.squeeze(x=mb.slice_by_index(x=x, begin=begin, end=end), axes=[axis])


def _outputs(ctx, node, y, *extras):
    outputs = [mb.identity(x=y, name=ctx.name(node))]
    for index, value in enumerate(extras, start=1):
        outputs.append(value if len(node.outputs) > index and wanted(node.outputs[index]) else None)
    return tuple(outputs)


def _wants(node, index: int) -> bool:
    return len(node.outputs) > index and wanted(node.outputs[index])


# -- com.microsoft Attention --------------------------------------------------------------------
def _masked_attention(ctx, node, q, k, v, *, mask_input: int, mask_name: str, past_length, dtype):
    """Attention and MultiHeadAttention alike: softmax(Q K^T * scale + bias) V, the bias summing the
    padding mask (input ``mask_input``), the causal frontier (``unidirectional``) after the past, and
    ``attention_bias`` (input 5)."""
    batch, _, q_length, _ = shape_of(q)
    total = shape_of(k)[2]
    filter_value = float(ctx.attr(node, "mask_filter_value", DEFAULT_MASK_FILTER))
    mask = ctx.input(node, mask_input, optional=True)
    bias_sum = None
    if mask is not None:
        bias_sum = padding_bias(ctx, node, mask, batch=batch, q_length=q_length, total=total, filter_value=filter_value,
                                dtype=dtype, what=mask_name)
    causal = bool(ctx.attr(node, "unidirectional", 0)) and q_length > 1
    bias_sum = add_bias(bias_sum, position_bias(node, q_length, total, past_length, causal, -1, -1, dtype))
    bias_sum = add_bias(bias_sum, _attention_bias(ctx, node, 5, dtype, q_length, total))
    y, _ = attend(ctx, node, q, k, v, scale=ctx.attr(node, "scale") or None, bias=bias_sum)
    return y


@lowers("Attention", domain=MS)
def microsoft_attention(ctx, node):
    """Packed-weight self attention: input (B, S, D_in) @ weights (D_in, D + D + D_v) + bias."""
    x, weight = ctx.input(node, 0), ctx.input(node, 1)
    _require_static(ctx, node, x, weight)
    _refuse_input(ctx, node, 6, "past_sequence_length", "shared past/present buffers need dynamic shapes")
    for attribute in ("do_rotary", "past_present_share_buffer"):
        if int(ctx.attr(node, attribute, 0) or 0):
            ctx.fail(node, f"{attribute}=1 is not supported",
                     hint="export without it (onnxruntime's CPU kernel refuses it too)")
    dtype = numpy_dtype(dtype_of(x))
    bias = _float_input(ctx, node, 2, dtype)
    heads = int(ctx.attr(node, "num_heads"))
    sizes = ctx.attr(node, "qkv_hidden_sizes") or [shape_of(weight)[1] // 3] * 3
    if len(sizes) != 3 or sum(sizes) != shape_of(weight)[1] or sizes[0] != sizes[1] or any(s % heads for s in sizes):
        ctx.fail(node, f"qkv_hidden_sizes {sizes} do not split the weights' {shape_of(weight)[1]} columns "
                 f"into Q, K, V of num_heads={heads}")
    edges = np.cumsum([0, *sizes]).tolist()
    projections = [_projection(x, weight, bias, edges[i], edges[i + 1]) for i in range(3)]
    q, k, v = (split_heads(ctx, node, p, heads, "QKV") for p in projections)

    past = ctx.input(node, 4, optional=True)
    if past is not None:
        _require_static(ctx, node, past)
        if rank_of(past) != 5 or shape_of(past)[0] != 2:
            ctx.fail(node, f"past must be (2, batch, heads, past_length, head_size); got {tuple(shape_of(past))}")
        past_key, past_value = (_take(past, 0, i) for i in (0, 1))
        k, v = mb.concat(values=[past_key, k], axis=2), mb.concat(values=[past_value, v], axis=2)
    past_length = shape_of(past)[3] if past is not None else 0

    y = _masked_attention(ctx, node, q, k, v, mask_input=3, mask_name="mask_index", past_length=past_length, dtype=dtype)
    present = mb.stack(values=[k, v], axis=0) if _wants(node, 1) else None
    return _outputs(ctx, node, merge_heads(y), present)


# -- com.microsoft MultiHeadAttention -------------------------------------------------------------
def _mha_qkv(ctx, node, heads: int, dtype):
    """Q (B, N, S, H) and K, V (B, N, L, H) from MultiHeadAttention's input forms, with the
    projection bias added; whether K/V came in already split into heads (BNSH)."""
    query, key, value = ctx.input(node, 0), ctx.input(node, 1, optional=True), ctx.input(node, 2, optional=True)
    _require_static(ctx, node, query, key, value)
    bias = _float_input(ctx, node, 3, dtype)
    if key is None:  # packed QKV (B, S, N, 3, H)
        if rank_of(query) != 5 or shape_of(query)[3] != 3:
            ctx.fail(node, f"without key, query must be packed QKV (B, S, N, 3, H); got {tuple(shape_of(query))}")
        batch, length, n, _, size = shape_of(query)
        q, k, v = (mb.reshape(x=_take(query, 3, i), shape=[batch, length, n * size]) for i in range(3))
    elif rank_of(key) == 5:  # packed KV (B, L, N, 2, H)
        if value is not None or shape_of(key)[3] != 2:
            ctx.fail(node, f"a 5-D key must be packed KV (B, L, N, 2, H) with no value input; "
                     f"got {tuple(shape_of(key))}")
        batch, length, n, _, size = shape_of(key)
        q, (k, v) = query, (mb.reshape(x=_take(key, 3, i), shape=[batch, length, n * size]) for i in range(2))
    else:
        q, k, v = query, key, value
        if v is None:
            ctx.fail(node, "value is required when key is given unpacked")
    if rank_of(q) != 3:
        ctx.fail(node, f"query must be (B, S, hidden) or packed QKV (B, S, N, 3, H); got {tuple(shape_of(q))}")
    kv_split = rank_of(k) == 4
    if kv_split != (rank_of(v) == 4):
        ctx.fail(node, "key and value must both be 3-D (B, L, hidden) or both 4-D (B, N, L, H)")
    if bias is not None:
        q_size, k_size = shape_of(q)[-1], shape_of(q)[-1]
        q = mb.add(x=q, y=_bias_slice(bias, 0, q_size))
        if not kv_split:  # K/V given per head come projected already (cross attention from a cache)
            v_size = shape_of(v)[-1]
            k = mb.add(x=k, y=_bias_slice(bias, q_size, q_size + k_size))
            v = mb.add(x=v, y=_bias_slice(bias, q_size + k_size, q_size + k_size + v_size))
    q = split_heads(ctx, node, q, heads, "query")
    if not kv_split:
        k, v = split_heads(ctx, node, k, heads, "key"), split_heads(ctx, node, v, heads, "value")
    return q, k, v, kv_split


def _bias_slice(bias, begin: int, end: int):
    return bias[begin:end] if isinstance(bias, np.ndarray) else mb.slice_by_index(x=bias, begin=[begin], end=[end])


@lowers("MultiHeadAttention", domain=MS)
def multi_head_attention(ctx, node):
    _refuse_input(ctx, node, 8, "past_sequence_length", "shared past/present buffers need dynamic shapes")
    _refuse_input(ctx, node, 9, "cache_indirection", "beam-search cache indirection is not supported")
    if _wants(node, 3):
        ctx.fail(node, "output 3 (qk) is not supported", hint="drop the output; it is a debugging aid")
    heads = int(ctx.attr(node, "num_heads"))
    dtype = numpy_dtype(dtype_of(ctx.input(node, 0)))
    q, k, v, kv_split = _mha_qkv(ctx, node, heads, dtype)
    past_key, past_value = ctx.input(node, 6, optional=True), ctx.input(node, 7, optional=True)
    if (past_key is None) != (past_value is None):
        ctx.fail(node, "past_key and past_value must be given together")
    past_length = 0
    if past_key is not None:
        _require_static(ctx, node, past_key, past_value)
        if kv_split:
            ctx.fail(node, "past_key/past_value cannot be combined with key/value given per head (B, N, L, H)")
        past_length = shape_of(past_key)[2]
        k, v = mb.concat(values=[past_key, k], axis=2), mb.concat(values=[past_value, v], axis=2)
    y = _masked_attention(ctx, node, q, k, v, mask_input=4, mask_name="key_padding_mask", past_length=past_length,
                          dtype=dtype)
    present_key, present_value = (k, v) if past_key is not None or not kv_split else (None, None)
    return _outputs(ctx, node, merge_heads(y), present_key, present_value)


# -- com.microsoft GroupQueryAttention ------------------------------------------------------------
def _gqa_positions(ctx, node, seqlens, *, batch: int, q_length: int, prompt: bool):
    """Absolute position of each query token, (B, S) int32: 0.. in a first prompt, else the
    tokens end at seqlens_k + 1 (the per-batch total length)."""
    steps = np.arange(q_length, dtype=np.int32)
    if prompt:
        return np.broadcast_to(steps, (batch, q_length)).copy(), 0
    if isinstance(seqlens, np.ndarray):
        offset = (seqlens.astype(np.int32) + 1 - q_length).reshape(batch, 1)
        return offset + steps, offset.reshape(batch, 1, 1, 1)
    offset = mb.reshape(x=mb.sub(x=seqlens, y=np.int32(q_length - 1)), shape=[batch, 1])
    return mb.add(x=offset, y=steps), mb.reshape(x=offset, shape=[batch, 1, 1, 1])


@lowers("GroupQueryAttention", domain=MS)
def group_query_attention(ctx, node):
    """Grouped-query self attention with a (B, N_kv, P, H) KV cache: the present cache is past +
    new tokens, and each batch's past fills its past buffer. Static shapes, or (a stateful
    decoder's) batch 1 with the query and past lengths known only at run time."""
    for index, name in ((12, "k_scale"), (13, "v_scale"), (14, "q_norm_weight"), (15, "k_norm_weight")):
        _refuse_input(ctx, node, index, name, "quantized KV caches and Q/K norms are not supported")
    for attribute in ("sliding_window_cache", "qk_output"):
        if int(ctx.attr(node, attribute, 0) or 0):
            ctx.fail(node, f"{attribute}={ctx.attr(node, attribute)} is not supported")
    for attribute in ("k_quant_type", "v_quant_type"):
        kind = ctx.attr(node, attribute, "NONE")
        if (kind.decode() if isinstance(kind, bytes) else kind) not in ("NONE", ""):
            ctx.fail(node, f"{attribute}={kind!r} (a quantized KV cache) is not supported")
    query, key, value = ctx.input(node, 0), ctx.input(node, 1, optional=True), ctx.input(node, 2, optional=True)
    past_key, past_value = ctx.input(node, 3, optional=True), ctx.input(node, 4, optional=True)
    if (past_key is None) != (past_value is None):
        ctx.fail(node, "past_key and past_value must be given together")
    if not all(is_static(d) for x in (query, key, value, past_key, past_value) if x is not None for d in shape_of(x)):
        return _dynamic_group_query_attention(ctx, node, query, key, value, past_key, past_value)
    heads, kv_heads = int(ctx.attr(node, "num_heads")), int(ctx.attr(node, "kv_num_heads"))
    dtype = numpy_dtype(dtype_of(query))
    batch, q_length, width = shape_of(query)
    if key is None:  # packed QKV: N*H + 2*N_kv*H columns
        size = width // (heads + 2 * kv_heads)
        columns = np.cumsum([0, heads * size, kv_heads * size, kv_heads * size]).tolist()
        query, key, value = (mb.slice_by_index(x=query, begin=[0, 0, start], end=[batch, q_length, stop])
                             for start, stop in zip(columns, columns[1:]))
    elif value is None:
        ctx.fail(node, "value is required when key is given")
    q = split_heads(ctx, node, query, heads, "query")
    k, v = split_heads(ctx, node, key, kv_heads, "key"), split_heads(ctx, node, value, kv_heads, "value")
    size = shape_of(q)[-1]

    past_length = shape_of(past_key)[2] if past_key is not None else 0
    total = past_length + q_length
    total_input = ctx.const_value(node.inputs[6]) if ctx.has_input(node, 6) else None
    if total_input is not None and int(np.asarray(total_input).reshape(-1)[0]) != total:
        given = int(np.asarray(total_input).reshape(-1)[0])
        ctx.fail(node, f"total_sequence_length is {given} but past ({past_length}) + new ({q_length}) tokens "
                 f"make {total}: shared past/present buffers are not supported")
    seqlens = _as_int32(ctx.input(node, 5))
    prompt = past_length == 0
    positions, offset = _gqa_positions(ctx, node, seqlens, batch=batch, q_length=q_length, prompt=prompt)
    q, k = _gqa_rotary(ctx, node, q, k, positions, dtype)
    if past_key is not None:
        k, v = mb.concat(values=[past_key, k], axis=2), mb.concat(values=[past_value, v], axis=2)

    # Keys past each batch's length (seqlens_k + 1) are padding; causal / window by position.
    lengths = mb.reshape(x=mb.add(x=to_var(seqlens), y=np.int32(1)), shape=[batch, 1, 1, 1])
    bias_sum = _where_visible(mb.less(x=np.arange(total, dtype=np.int32), y=lengths), float("-inf"), dtype)
    causal, left = _gqa_window(ctx, node)
    bias_sum = add_bias(bias_sum, position_bias(node, q_length, total, offset, causal, left, -1, dtype))
    bias_sum = add_bias(bias_sum, _attention_bias(ctx, node, 10, dtype, q_length, total))
    y, _ = attend(ctx, node, q, k, v, scale=ctx.attr(node, "scale") or None, bias=bias_sum,
                  softcap=float(ctx.attr(node, "softcap", 0.0) or 0.0), sink=_gqa_sink(ctx, node))
    return _outputs(ctx, node, merge_heads(y), k, v)


def _gqa_window(ctx, node) -> tuple[bool, int]:
    """(causal, left window): local_window_size counts the query token itself, so key j is seen
    when i - j < window."""
    window = int(ctx.attr(node, "local_window_size", -1))
    return bool(ctx.attr(node, "causal", 1)), (window - 1 if window > 0 else -1)


def _gqa_sink(ctx, node):
    if ctx.has_input(node, 11):
        return ctx.const(node, 11, what="head_sink")
    return 0.0 if int(ctx.attr(node, "smooth_softmax", 0) or 0) else None


def _gqa_rotary(ctx, node, q, k, positions, dtype):
    """do_rotary=1: Q and K rotated at ``positions`` (B, S) with the cos/sin caches (inputs 7, 8)."""
    if not int(ctx.attr(node, "do_rotary", 0) or 0):
        return q, k
    cos, sin = _float_input(ctx, node, 7, dtype), _float_input(ctx, node, 8, dtype)
    if cos is None or sin is None:
        ctx.fail(node, "do_rotary=1 needs cos_cache and sin_cache")
    size, rotary_dim = shape_of(q)[-1], 2 * shape_of(cos)[-1]
    if rotary_dim > size:
        ctx.fail(node, f"cos_cache has {shape_of(cos)[-1]} columns, more than half the head size {size}")
    cos, sin = gather_positions(cos, positions), gather_positions(sin, positions)  # (B, S, R/2)
    cos, sin = (mb.expand_dims(x=to_var(c), axes=[1]) for c in (cos, sin))
    interleaved = bool(ctx.attr(node, "rotary_interleaved", 0))
    return (rotate(q, cos, sin, interleaved=interleaved, rotary_dim=rotary_dim),
            rotate(k, cos, sin, interleaved=interleaved, rotary_dim=rotary_dim))


# GroupQueryAttention with run-time lengths: a stateful decoder (generate:) feeds Q tokens after
# a past read from its state, both lengths known only at run time. Batch 1; the sequence axis
# is left to -1 / end masks wherever the static helpers above write it out.
def _split_heads_dynamic(x, heads: int):
    """(1, S, N*H) -> (1, N, S, H)."""
    width = shape_of(x)[-1]
    return mb.transpose(x=mb.reshape(x=x, shape=[1, -1, heads, width // heads]), perm=[0, 2, 1, 3])


def _dynamic_group_query_attention(ctx, node, query, key, value, past_key, past_value):
    heads, kv_heads = int(ctx.attr(node, "num_heads")), int(ctx.attr(node, "kv_num_heads"))
    batch, width = shape_of(query)[0], shape_of(query)[-1]
    if batch != 1 or not is_static(width) or any(
            x is not None and not is_static(shape_of(x)[-1]) for x in (key, value, past_key, past_value)):
        ctx.fail(node, f"needs static input shapes, or batch 1 with static hidden sizes (query is {shape_of(query)})",
                 hint="pin the input shapes in the recipe")
    if ctx.has_input(node, 10) or _gqa_sink(ctx, node) is not None:
        ctx.fail(node, "attention_bias, head_sink and smooth_softmax with run-time sequence lengths are not supported",
                 hint="pin the input shapes in the recipe")
    dtype = numpy_dtype(dtype_of(query))
    if key is None:  # packed QKV: N*H + 2*N_kv*H columns
        size = width // (heads + 2 * kv_heads)
        columns = np.cumsum([0, heads * size, kv_heads * size, kv_heads * size]).tolist()
        query, key, value = (mb.slice_by_index(x=query, begin=[0, 0, start], end=[0, 0, stop],
                                               end_mask=[True, True, False])
                             for start, stop in zip(columns, columns[1:]))
    elif value is None:
        ctx.fail(node, "value is required when key is given")
    q = _split_heads_dynamic(query, heads)
    k, v = _split_heads_dynamic(key, kv_heads), _split_heads_dynamic(value, kv_heads)

    # Query token i sits at seqlens_k + 1 - S + i; key j is padding from seqlens_k + 1 on.
    q_length = dim(q, 2)
    seqlens = mb.reshape(x=to_var(_as_int32(ctx.input(node, 5))), shape=[1])
    offset = mb.sub(x=mb.add(x=seqlens, y=np.int32(1)), y=q_length)  # (1,)
    steps = mb.range_1d(start=np.int32(0), end=q_length, step=np.int32(1))
    positions = mb.expand_dims(x=mb.add(x=offset, y=steps), axes=[0])  # (1, S)
    q, k = _gqa_rotary(ctx, node, q, k, positions, dtype)
    if past_key is not None:
        k, v = mb.concat(values=[past_key, k], axis=2), mb.concat(values=[past_value, v], axis=2)

    keys = mb.range_1d(start=np.int32(0), end=dim(k, 2), step=np.int32(1))  # (T,)
    visible = mb.less(x=keys, y=mb.add(x=seqlens, y=np.int32(1)))
    causal, left = _gqa_window(ctx, node)
    diff = mb.sub(x=mb.expand_dims(x=positions, axes=[-1]), y=keys)  # (1, S, T): i - j in absolute positions
    if causal:
        visible = mb.logical_and(x=visible, y=mb.greater_equal(x=diff, y=np.int32(0)))
    if left >= 0:
        visible = mb.logical_and(x=visible, y=mb.less_equal(x=diff, y=np.int32(left)))
    bias = mb.expand_dims(x=_where_visible(visible, float("-inf"), dtype), axes=[1])  # (1, 1, S or 1, T)
    y, _ = attend(ctx, node, q, k, v, scale=ctx.attr(node, "scale") or None, bias=bias,
                  softcap=float(ctx.attr(node, "softcap", 0.0) or 0.0))
    merged = mb.reshape(x=mb.transpose(x=y, perm=[0, 2, 1, 3]), shape=[1, -1, heads * shape_of(y)[-1]])
    return _outputs(ctx, node, merged, k, v)
