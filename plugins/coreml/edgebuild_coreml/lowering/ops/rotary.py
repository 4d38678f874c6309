"""Rotary position embeddings: ONNX RotaryEmbedding (opset 23) and com.microsoft's.

Both rotate the first ``rotary_dim`` channels of every head by per-position angles whose
cosines and sines come from caches of shape (positions, rotary_dim / 2): pairs are the two
halves of the rotated channels, or (``interleaved``) neighbouring channels. Channels past
``rotary_dim`` pass through. :func:`rotate` is shared with GroupQueryAttention's do_rotary.

Only the head axis (the last) must be static: decoders export batch and sequence lengths as
dynamic dims, so every slice runs along the last axis alone and every reshape keeps the
leading dims as they are at run time.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import dtype_of, is_static, numpy_dtype, rank_of, shape_of, to_var
from edgebuild_coreml.lowering.registry import lowers


def _last_axis(x, begin: int, end: int, stride: int = 1):
    """``x[..., begin:end:stride]``; the other axes whole, whatever their (run-time) length."""
    rank = rank_of(x)
    begins, ends = [0] * rank, [0] * rank
    begins[-1], ends[-1] = begin, end
    whole = [True] * (rank - 1) + [False]
    return mb.slice_by_index(x=x, begin=begins, end=ends, stride=[1] * (rank - 1) + [stride],
                             begin_mask=whole, end_mask=whole)


def _reshape_tail(x, keep: int, tail: list[int]):
    """``x`` reshaped to its first ``keep`` dims followed by ``tail`` (static): the kept dims are
    read at run time when any of them is unknown."""
    leading = list(shape_of(x)[:keep])
    if all(is_static(d) for d in leading):
        return mb.reshape(x=x, shape=[int(d) for d in leading] + tail)
    kept = mb.slice_by_index(x=mb.shape(x=x), begin=[0], end=[keep])
    return mb.reshape(x=x, shape=mb.concat(values=[kept, np.array(tail, np.int32)], axis=0))


def rotate(x, cos, sin, *, interleaved: bool, rotary_dim: int):
    """``x`` (..., D) with its first ``rotary_dim`` channels rotated; ``cos``/``sin`` broadcast
    against (..., rotary_dim / 2)."""
    size = shape_of(x)[-1]
    half = rotary_dim // 2
    rotated = x if rotary_dim == size else _last_axis(x, 0, rotary_dim)
    if interleaved:
        x1, x2 = _last_axis(rotated, 0, rotary_dim, 2), _last_axis(rotated, 1, rotary_dim, 2)
    else:
        x1, x2 = _last_axis(rotated, 0, half), _last_axis(rotated, half, rotary_dim)
    real = mb.sub(x=mb.mul(x=x1, y=cos), y=mb.mul(x=x2, y=sin))
    imag = mb.add(x=mb.mul(x=x1, y=sin), y=mb.mul(x=x2, y=cos))
    if interleaved:
        pairs = mb.stack(values=[real, imag], axis=-1)
        out = _reshape_tail(pairs, rank_of(real) - 1, [rotary_dim])
    else:
        out = mb.concat(values=[real, imag], axis=-1)
    if rotary_dim < size:
        out = mb.concat(values=[out, _last_axis(x, rotary_dim, size)], axis=-1)
    return out


def _cache(ctx, node, index: int, dtype):
    """A cos/sin cache in the input's float type."""
    cache, wanted_dtype = ctx.input(node, index), dtype_of(np.zeros(1, dtype))
    if isinstance(cache, np.ndarray):
        return cache.astype(dtype)
    return cache if dtype_of(cache) == wanted_dtype else mb.cast(x=cache, dtype=wanted_dtype)


def gather_positions(cache, positions):
    """Rows of a (positions, rotary_dim / 2) cache: ``positions`` an int array/Var of any shape."""
    if isinstance(cache, np.ndarray) and isinstance(positions, np.ndarray):
        return cache[positions]
    return mb.gather(x=cache, indices=positions, axis=0)


def _as_bsnd(ctx, node, x, heads: int | None, head_size: int | None):
    """x as (B, S, N, D): 4-D (B, N, S, D) inputs are transposed, 3-D (B, S, N*D) reshaped."""
    if rank_of(x) == 4:
        return mb.transpose(x=x, perm=[0, 2, 1, 3])
    if rank_of(x) != 3:
        ctx.fail(node, "input must be 3-D (batch, sequence, hidden) or 4-D (batch, heads, sequence, head); "
                 f"got rank {rank_of(x)}")
    hidden = shape_of(x)[-1]
    if not is_static(hidden):
        ctx.fail(node, "the hidden size (last axis) must be static to split it into heads",
                 hint="export the model with a fixed hidden size")
    if heads:
        head_size = hidden // heads
    if not head_size or hidden % head_size:
        ctx.fail(node, f"cannot split the hidden size {hidden} into heads", hint="set num_heads")
    return _reshape_tail(x, 2, [hidden // head_size, head_size])


def _restore(x_bsnd, original):
    if rank_of(original) == 4:
        return mb.transpose(x=x_bsnd, perm=[0, 2, 1, 3])
    return _reshape_tail(x_bsnd, 2, [int(shape_of(original)[-1])])


def _check_head_size(ctx, node, x):
    if not is_static(shape_of(x)[-1]):
        ctx.fail(node, f"needs a static last axis (the head or hidden size); got shape {shape_of(x)}",
                 hint="export the model with a fixed head size")


@lowers("RotaryEmbedding", since=23)
def rotary_embedding(ctx, node):
    """ONNX: caches are (max_position, R/2) gathered by ``position_ids`` (B, S), or, without
    position_ids, already (B, S, R/2)."""
    x = ctx.input(node, 0)
    _check_head_size(ctx, node, x)
    dtype = numpy_dtype(dtype_of(x))
    cos, sin = _cache(ctx, node, 1, dtype), _cache(ctx, node, 2, dtype)
    positions = ctx.input(node, 3, optional=True)
    heads = int(ctx.attr(node, "num_heads", 0) or 0)
    if rank_of(x) == 3 and not heads:
        ctx.fail(node, "a 3-D input needs the num_heads attribute")
    x_bsnd = _as_bsnd(ctx, node, x, heads or None, None)
    head_size = shape_of(x_bsnd)[-1]
    rotary_dim = int(ctx.attr(node, "rotary_embedding_dim", 0) or 0) or head_size
    if rotary_dim % 2 or rotary_dim > head_size:
        ctx.fail(node, f"rotary_embedding_dim {rotary_dim} must be even and at most the head size {head_size}")
    if positions is not None:
        cos, sin = gather_positions(cos, positions), gather_positions(sin, positions)
    elif rank_of(cos) != 3:
        ctx.fail(node, "without position_ids the caches must be 3-D (batch, sequence, rotary_dim/2); "
                 f"got rank {rank_of(cos)}")
    for name, cache in (("cos_cache", cos), ("sin_cache", sin)):
        if shape_of(cache)[-1] != rotary_dim // 2:
            ctx.fail(node, f"{name} has {shape_of(cache)[-1]} columns; "
                     f"rotary_embedding_dim {rotary_dim} needs {rotary_dim // 2}")
    cos, sin = (mb.expand_dims(x=to_var(c), axes=[2]) for c in (cos, sin))
    rotated = rotate(x_bsnd, cos, sin, interleaved=bool(ctx.attr(node, "interleaved", 0)), rotary_dim=rotary_dim)
    return mb.identity(x=_restore(rotated, x), name=ctx.name(node))


def _microsoft_positions(ctx, node, positions, x_bsnd):
    """position_ids of shape (1) are the first position of every batch; (B, S) are explicit."""
    if rank_of(positions) == 1 and shape_of(positions)[0] == 1:
        length = shape_of(x_bsnd)[1]
        if is_static(length):
            steps = np.arange(int(length), dtype=np.int32)
            if isinstance(positions, np.ndarray):
                return (positions.astype(np.int32) + steps)[None]
        else:
            end = mb.gather(x=mb.shape(x=x_bsnd), indices=np.int32(1), axis=0)
            steps = mb.range_1d(start=np.int32(0), end=end, step=np.int32(1))
        positions = to_var(positions)
        if dtype_of(positions) != "int32":
            positions = mb.cast(x=positions, dtype="int32")
        return mb.expand_dims(x=mb.add(x=positions, y=steps), axes=[0])
    if rank_of(positions) != 2:
        ctx.fail(node, f"position_ids must have shape (1) or (batch, sequence); got {shape_of(positions)}")
    return positions


@lowers("RotaryEmbedding", domain="com.microsoft")
def microsoft_rotary_embedding(ctx, node):
    x = ctx.input(node, 0)
    _check_head_size(ctx, node, x)
    if int(ctx.attr(node, "is_packed_batching", 0) or 0):
        ctx.fail(node, "is_packed_batching=1 (ragged batches) is not supported", hint="export with padded batches")
    if float(ctx.attr(node, "scale", 1.0)) != 1.0:
        ctx.fail(node, "scale other than 1.0 is not supported (onnxruntime's CPU kernel does not use it either)")
    dtype = numpy_dtype(dtype_of(x))
    cos, sin = _cache(ctx, node, 2, dtype), _cache(ctx, node, 3, dtype)
    heads = int(ctx.attr(node, "num_heads", 0) or 0)
    rotary_dim = int(ctx.attr(node, "rotary_embedding_dim", 0) or 0)
    if rotary_dim and not heads and rank_of(x) == 3:
        ctx.fail(node, "rotary_embedding_dim needs num_heads with a 3-D input")
    # Without rotary_embedding_dim the whole head rotates, so the cache width gives the head size.
    x_bsnd = _as_bsnd(ctx, node, x, heads or None, None if heads else 2 * shape_of(cos)[-1])
    rotary_dim = rotary_dim or shape_of(x_bsnd)[-1]
    if shape_of(cos)[-1] * 2 != rotary_dim or shape_of(sin)[-1] * 2 != rotary_dim:
        ctx.fail(node, f"cos_cache/sin_cache have {shape_of(cos)[-1]} columns; "
                 f"the rotary dimension {rotary_dim} needs {rotary_dim // 2}")
    positions = _microsoft_positions(ctx, node, ctx.input(node, 1), x_bsnd)
    cos, sin = gather_positions(cos, positions), gather_positions(sin, positions)
    cos, sin = (mb.expand_dims(x=to_var(c), axes=[2]) for c in (cos, sin))
    rotated = rotate(x_bsnd, cos, sin, interleaved=bool(ctx.attr(node, "interleaved", 0)), rotary_dim=rotary_dim)
    return mb.identity(x=_restore(rotated, x), name=ctx.name(node))
