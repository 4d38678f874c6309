"""ONNX Attention (opsets 23-25) as matmul + additive bias + masked softmax + matmul.

With fewer K/V heads than query heads the matmuls group the query heads per K/V head
(:func:`grouped_matmul`) rather than repeating K/V.

The bias gathers everything that hides keys: ``attn_mask`` (boolean: keep where true;
float: added), the causal frontier (bottom-right aligned after a KV cache), the sliding
window and the per-batch ``nonpad_kv_seqlen`` padding, each as 0 / -inf. Query rows whose
keys are all hidden produce zeros, as the ONNX reference does, instead of softmax's NaNs.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import dtype_of, is_static, numpy_dtype, rank_of, select, shape_of, wanted
from edgebuild_coreml.lowering.registry import lowers


def split_heads(ctx, node, x, heads: int | None, what: str):
    """(B, S, H*D) -> (B, H, S, D); 4-D inputs pass through."""
    if rank_of(x) == 4:
        return x
    if rank_of(x) != 3 or not heads:
        ctx.fail(node, f"{what} must be 4-D, or 3-D with q_num_heads/kv_num_heads set")
    batch, length, hidden = shape_of(x)
    split = mb.reshape(x=x, shape=[batch, length, heads, hidden // heads])
    return mb.transpose(x=split, perm=[0, 2, 1, 3])


def merge_heads(y):
    """(B, H, S, D) -> (B, S, H*D)."""
    batch, heads, length, size = shape_of(y)
    return mb.reshape(x=mb.transpose(x=y, perm=[0, 2, 1, 3]), shape=[batch, length, heads * size])


def repeat_heads(x, repeats: int):
    """np.repeat(x, repeats, axis=1) for (B, H, L, D): each KV head serves ``repeats`` query heads."""
    if repeats == 1:
        return x
    batch, heads, length, size = shape_of(x)
    tiled = mb.tile(x=mb.expand_dims(x=x, axes=[2]), reps=[1, 1, repeats, 1, 1])
    return mb.reshape(x=tiled, shape=[batch, heads * repeats, length, size])


def _dim(x, axis: int):
    """Axis ``axis`` of ``x``: an int when static, else a 1-element int32 tensor read at run time."""
    size = shape_of(x)[axis]
    if is_static(size):
        return int(size)
    return mb.slice_by_index(x=mb.shape(x=x), begin=[axis % rank_of(x)], end=[axis % rank_of(x) + 1])


def _times(size, factor: int):
    return size * factor if isinstance(size, int) else mb.mul(x=size, y=np.int32(factor))


def _reshape(x, dims: list):
    """mb.reshape to ``dims`` (ints, or run-time sizes from :func:`_dim`): one unknown size becomes
    -1, several a shape tensor; a decoder's query and key lengths are both unknown."""
    unknown = [i for i, size in enumerate(dims) if not isinstance(size, int)]
    if len(unknown) <= 1:
        return mb.reshape(x=x, shape=[-1 if i in unknown else size for i, size in enumerate(dims)])
    parts = [size if i in unknown else np.array([size], np.int32) for i, size in enumerate(dims)]
    return mb.reshape(x=x, shape=mb.concat(values=parts, axis=0))


def group_query_heads(ctx, node, q, mask, kv_heads: int, *, heads: int | None = None):
    """Grouped-query attention without repeated K/V: (B, H, S, D) Q -> (B, Hkv, G*S, D), so each
    K/V head serves its G query heads as G times as many query rows.

    Returns the regrouped Q, the mask regrouped to match (tiled over the group when it is
    shared by all heads: a mask is small, K/V are not), and a function that turns the
    (B, Hkv, G*S, Dv) result back into (B, H, S, Dv). Only the head count must be known (from
    the shape, or ``heads``)."""
    heads = shape_of(q)[1] if heads is None else heads
    if not is_static(heads):
        ctx.fail(node, f"grouped-query attention needs a static head count; got Q of shape {shape_of(q)}")
    batch, size = _dim(q, 0), _dim(q, 3)
    if heads % kv_heads:
        ctx.fail(node, f"{heads} query heads cannot share {kv_heads} key/value heads evenly")
    group = heads // kv_heads
    length = _dim(q, 2)
    grouped_q = _reshape(q, [batch, kv_heads, _times(length, group), size])
    if mask is not None:
        mask = _group_mask(ctx, node, mask, heads, kv_heads, length)

    def restore(y):
        return _reshape(y, [batch, heads, length, _dim(y, -1)])

    return grouped_q, mask, restore


def _group_mask(ctx, node, mask, heads: int, kv_heads: int, length):
    """An additive mask broadcastable to (B, H, S, T) as one broadcastable to (B, Hkv, G*S, T)."""
    group = heads // kv_heads
    shape = list(shape_of(mask))
    if len(shape) > 4 or not is_static(([1] * (4 - len(shape)) + shape)[1]):
        ctx.fail(node, f"the attention mask must be at most 4-D with a static head dim; got shape {shape}")
    constant = isinstance(mask, np.ndarray)
    if len(shape) < 4:
        padding = list(range(4 - len(shape)))
        mask = mask.reshape([1] * len(padding) + shape) if constant else mb.expand_dims(x=mask, axes=padding)
        shape = [1] * len(padding) + shape
    mask_heads, rows = shape[1], shape[2]
    if mask_heads == 1:
        if rows == 1:
            return mask
        return np.tile(mask, (1, 1, group, 1)) if constant else mb.tile(x=mask, reps=[1, 1, group, 1])
    if constant:
        full = [shape[0], heads, length, shape[3]]
        return np.ascontiguousarray(np.broadcast_to(mask, full)).reshape([shape[0], kv_heads, group * length, shape[3]])
    if rows != length:
        if not isinstance(length, int):
            ctx.fail(node, "a per-head attention mask broadcast over a dynamic query length is not supported",
                     hint="pin the query length in the recipe")
        mask = mb.tile(x=mask, reps=[1, 1, length, 1])
    return _reshape(mask, [_dim(mask, 0), kv_heads, _times(_dim(mask, 2), group), _dim(mask, 3)])


def grouped_matmul(a, kv, *, transpose_y: bool = False):
    """``a`` (B, H, S, X) times each query head's K/V head from ``kv`` (B, Hkv, ., .), Hkv
    dividing H: the G query heads of a K/V head become G*S rows of one matmul, so K/V are
    never repeated."""
    heads, kv_heads = shape_of(a)[1], shape_of(kv)[1]
    if kv_heads in (1, heads):
        return mb.matmul(x=a, y=kv, transpose_y=transpose_y)
    group = heads // kv_heads
    batch = _dim(a, 0)
    length = _dim(a, 2)
    grouped = _reshape(a, [batch, kv_heads, _times(length, group), _dim(a, 3)])
    product = mb.matmul(x=grouped, y=kv, transpose_y=transpose_y)
    return _reshape(product, [batch, heads, length, _dim(product, -1)])


def hidden_bias(mask_or_allowed, dtype):
    """0 where allowed (true), -inf elsewhere, in ``dtype``."""
    zero, minus_inf = np.array(0, dtype), np.array(-np.inf, dtype)
    return select(mask_or_allowed, zero, minus_inf)


def _mask_bias(ctx, node, mask, kv_length: int, dtype):
    """``attn_mask`` as an additive bias, padded with -inf up to the key length."""
    bias = hidden_bias(mask, dtype) if dtype_of(mask) == "bool" else mask
    if dtype_of(bias) != dtype_of(np.zeros(1, dtype)):
        bias = mb.cast(x=bias, dtype=dtype_of(np.zeros(1, dtype)))
    missing = kv_length - shape_of(bias)[-1]
    if missing > 0:
        pad = [0] * (2 * rank_of(bias))
        pad[-1] = missing
        bias = mb.pad(x=bias, pad=np.array(pad, np.int32), mode="constant", constant_val=float("-inf"))
    return bias


def position_bias(node, q_length, kv_length, offset, causal, left, right, dtype):
    """Causal / sliding-window bias. ``offset`` (int, or an int32 Var of shape (B,1,1,1))
    moves query i to absolute position i + offset; key j is visible when j <= i + offset
    (causal) and within the window."""
    if not causal and left < 0 and right < 0:
        return None
    diff = np.arange(q_length)[:, None] - np.arange(kv_length)[None, :]  # i - j
    if isinstance(offset, int):
        diff = (diff + offset).astype(np.int32)
        allowed = np.ones(diff.shape, bool)
        if causal:
            allowed &= diff >= 0
        if left >= 0:
            allowed &= diff <= left
        if right >= 0:
            allowed &= -diff <= right
        return np.where(allowed, 0, -np.inf).astype(dtype)
    diff = mb.add(x=offset, y=diff.astype(np.int32))
    conditions = []
    if causal:
        conditions.append(mb.greater_equal(x=diff, y=np.int32(0)))
    if left >= 0:
        conditions.append(mb.less_equal(x=diff, y=np.int32(left)))
    if right >= 0:
        conditions.append(mb.greater_equal(x=diff, y=np.int32(-right)))
    allowed = conditions[0]
    for condition in conditions[1:]:
        allowed = mb.logical_and(x=allowed, y=condition)
    return hidden_bias(allowed, dtype)


def add_bias(a, b):
    """a + b where either may be None (absent) or a numpy constant."""
    if a is None:
        return b
    if b is None:
        return a
    return mb.add(x=a, y=b) if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) else a + b


def masked_softmax(scores, dtype):
    """Softmax over the last axis where an all -inf row gives zeros (not NaN)."""
    row_max = mb.reduce_max(x=scores, axes=[-1], keep_dims=True)
    all_hidden = mb.equal(x=row_max, y=np.array(-np.inf, dtype))
    safe_max = select(all_hidden, np.array(0, dtype), row_max)
    exps = mb.exp(x=mb.sub(x=scores, y=safe_max))
    total = mb.reduce_sum(x=exps, axes=[-1], keep_dims=True)
    total = select(mb.equal(x=total, y=np.array(0, dtype)), np.array(1, dtype), total)
    return mb.real_div(x=exps, y=total)


def scaled_scores(q, k, scale: float, softcap: float = 0.0):
    """Q K^T * scale, scaled on both sides by sqrt(scale) (as the ONNX reference does, which
    keeps fp16 products in range), then soft-capped (cap * tanh(s / cap)) when softcap > 0."""
    dtype = numpy_dtype(dtype_of(q))
    root = np.array(np.sqrt(scale), dtype)
    scores = grouped_matmul(mb.mul(x=q, y=root), mb.mul(x=k, y=root), transpose_y=True)
    if softcap > 0:
        cap = np.array(softcap, dtype)
        scores = mb.mul(x=mb.tanh(x=mb.real_div(x=scores, y=cap)), y=cap)
    return scores


@lowers("Attention", since=23)
def attention(ctx, node):
    q_in, k_in, v_in = ctx.input(node, 0), ctx.input(node, 1), ctx.input(node, 2)
    mask = ctx.input(node, 3, optional=True)
    past_key, past_value = ctx.input(node, 4, optional=True), ctx.input(node, 5, optional=True)
    nonpad = ctx.input(node, 6, optional=True)
    if (past_key is None) != (past_value is None):
        ctx.fail(node, "past_key and past_value must be given together")
    for x in (q_in, k_in, v_in):
        if not all(is_static(d) for d in shape_of(x)):
            ctx.fail(node, "needs static Q/K/V shapes", hint="pin the input shapes in the recipe")
    q_heads, kv_heads = ctx.attr(node, "q_num_heads"), ctx.attr(node, "kv_num_heads")
    q = split_heads(ctx, node, q_in, q_heads, "Q")
    k = split_heads(ctx, node, k_in, kv_heads, "K")
    v = split_heads(ctx, node, v_in, kv_heads, "V")
    dtype = numpy_dtype(dtype_of(q))

    if past_key is not None:
        k = mb.concat(values=[past_key, k], axis=2)
        v = mb.concat(values=[past_value, v], axis=2)
    present_key, present_value = k, v
    q_length, kv_length = shape_of(q)[2], shape_of(k)[2]
    if shape_of(q)[1] % shape_of(k)[1]:
        ctx.fail(node, f"{shape_of(q)[1]} query heads cannot share {shape_of(k)[1]} key/value heads evenly")

    scale = ctx.attr(node, "scale")
    scale = float(scale) if scale is not None else 1.0 / np.sqrt(shape_of(q)[3])
    scores = scaled_scores(q, k, scale, float(ctx.attr(node, "softcap", 0.0) or 0.0))

    # Where query i sits among the keys: after the cache, or (external cache) at
    # nonpad_kv_seqlen - q_length per batch.
    if nonpad is not None and past_key is None:
        lengths = mb.cast(x=nonpad, dtype="int32") if dtype_of(nonpad) != "int32" else nonpad
        offset = mb.reshape(x=mb.sub(x=lengths, y=np.int32(q_length)), shape=[-1, 1, 1, 1])
    else:
        offset = shape_of(past_key)[2] if past_key is not None else 0
    causal = bool(ctx.attr(node, "is_causal", 0))
    left, right = int(ctx.attr(node, "left_window_size", -1)), int(ctx.attr(node, "right_window_size", -1))
    bias = _mask_bias(ctx, node, mask, kv_length, dtype) if mask is not None else None
    bias = add_bias(bias, position_bias(node, q_length, kv_length, offset, causal, left, right, dtype))
    if nonpad is not None:
        lengths = mb.cast(x=nonpad, dtype="int32") if dtype_of(nonpad) != "int32" else nonpad
        visible = mb.less(x=np.arange(kv_length, dtype=np.int32), y=mb.reshape(x=lengths, shape=[-1, 1, 1, 1]))
        bias = add_bias(bias, hidden_bias(visible, dtype))

    biased = add_bias(scores, bias) if bias is not None else scores
    probabilities = masked_softmax(biased, dtype) if bias is not None else mb.softmax(x=scores, axis=-1)
    y = grouped_matmul(probabilities, v)
    if rank_of(q_in) == 3:
        y = merge_heads(y)
    outputs = [mb.identity(x=y, name=ctx.name(node))]
    for index, value in ((1, present_key), (2, present_value)):
        outputs.append(value if len(node.outputs) > index and wanted(node.outputs[index]) else None)
    if len(node.outputs) > 3 and wanted(node.outputs[3]):
        mode = int(ctx.attr(node, "qk_matmul_output_mode", 0))
        outputs.append({0: scores, 1: scores, 2: biased, 3: probabilities}.get(mode, scores))
    return tuple(outputs)
