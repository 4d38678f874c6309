"""QuantizeLinear / DequantizeLinear.

A DequantizeLinear of a constant int8/uint8 weight stays compressed in the artifact: it
becomes ``constexpr_blockwise_shift_scale`` (iOS18+, per-tensor, per-axis or blockwise) or
``constexpr_affine_dequantize`` (iOS16/17, per-tensor or per-axis), which Core ML expands at
load time. Runtime tensors are (de)quantised with float arithmetic; quantised values travel
as int32, the integer type Core ML programs compute in.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.context import target_index
from edgebuild_coreml.lowering.ops._nn_util import as_float, rank_of
from edgebuild_coreml.lowering.registry import lowers

_RANGES = {np.dtype(np.int8): (-128, 127), np.dtype(np.uint8): (0, 255), np.dtype(np.int16): (-32768, 32767),
           np.dtype(np.uint16): (0, 65535)}


def _broadcast_param(param, rank: int, axis: int, block: int, size: int | None):
    """Scale / zero point reshaped to broadcast against the data (per-tensor, per-axis, blockwise)."""
    if param is None or np.ndim(param) == 0 or np.size(param) == 1 and block == 0:
        return param if param is None else np.asarray(param).reshape(())
    param = np.asarray(param)
    if block:
        param = np.repeat(param, block, axis=axis)
        if size is not None:
            param = np.take(param, np.arange(size), axis=axis)
        return param
    view = [1] * rank
    view[axis] = param.size
    return param.reshape(view)


def _axis(ctx, node, rank: int) -> int:
    axis = int(ctx.attr(node, "axis", 1))
    return axis + rank if axis < 0 else axis


@lowers("DequantizeLinear", since=10)
def dequantize_linear(ctx, node):
    x = ctx.input(node, 0)
    scale = as_float(ctx.input(node, 1))
    zero = ctx.input(node, 2, optional=True)
    rank = rank_of(x)
    axis = _axis(ctx, node, rank) if rank else 0
    block = int(ctx.attr(node, "block_size", 0))
    if isinstance(x, np.ndarray) and isinstance(scale, np.ndarray) and (zero is None or isinstance(zero, np.ndarray)):
        return _constant_weight(ctx, node, x, scale, zero, axis, block)
    if not isinstance(scale, np.ndarray):
        ctx.fail(node, "a runtime scale is not supported", "make the scale an initializer")
    if zero is not None and not isinstance(zero, np.ndarray):
        ctx.fail(node, "a runtime zero point is not supported", "make the zero point an initializer")
    size = x.shape[axis] if rank else None
    values = mb.cast(x=x, dtype="fp32", name=ctx.name(node, "as_float"))
    if zero is not None and np.any(zero):
        offset = _broadcast_param(zero.astype(np.float32), rank, axis, block, size)
        values = mb.sub(x=values, y=offset, name=ctx.name(node, "centred"))
    factor = _broadcast_param(scale.astype(np.float32), rank, axis, block, size)
    return mb.mul(x=values, y=factor, name=ctx.name(node))


def _constant_weight(ctx, node, data, scale, zero, axis, block):
    """Keep an int8/uint8 constant compressed behind a constexpr op when the target allows."""
    rank = data.ndim
    zero = np.zeros((), data.dtype) if zero is None else zero.astype(data.dtype)
    compressible = data.dtype in (np.int8, np.uint8) and rank >= 1
    if compressible and target_index(ctx.target) >= target_index("iOS18"):
        if block:  # ONNX blockwise scales already have the data's rank
            if any(d % s for d, s in zip(data.shape, scale.shape)):
                ctx.fail(node, "blockwise scales must tile the weight exactly for Core ML")
            zero = np.broadcast_to(zero, scale.shape) if zero.size == 1 else zero.reshape(scale.shape)
        else:
            scale_shape = [1] * rank
            if scale.size > 1:
                scale_shape[axis] = scale.size
            scale = scale.reshape(scale_shape)
            zero = np.broadcast_to(zero.reshape([1] * rank), scale_shape) if zero.size == 1 else zero.reshape(scale_shape)
        return mb.constexpr_blockwise_shift_scale(
            data=data, scale=scale.astype(np.float32), offset=np.ascontiguousarray(zero), name=ctx.name(node)
        )
    if compressible and not block and target_index(ctx.target) >= target_index("iOS16"):
        return mb.constexpr_affine_dequantize(
            quantized_data=data, zero_point=zero.reshape(-1) if zero.size > 1 else zero.reshape(()),
            scale=scale.astype(np.float32).reshape(-1) if scale.size > 1 else scale.astype(np.float32).reshape(()),
            axis=axis, name=ctx.name(node),
        )
    # Older targets, int32/int16 data or blockwise before iOS18: fold to a float constant.
    size = data.shape[axis] if rank else None
    offset = _broadcast_param(zero.astype(np.float32), rank, axis, block, size)
    factor = _broadcast_param(scale.astype(np.float32), rank, axis, block, size)
    return ((data.astype(np.float32) - offset) * factor).astype(np.float32)


@lowers("QuantizeLinear", since=10)
def quantize_linear(ctx, node):
    """saturate(round_half_even(x / scale) + zero_point), as int32 values."""
    x = as_float(ctx.input(node, 0))
    scale = as_float(ctx.input(node, 1))
    zero = ctx.input(node, 2, optional=True)
    if not isinstance(scale, np.ndarray) or (zero is not None and not isinstance(zero, np.ndarray)):
        ctx.fail(node, "runtime scale or zero point is not supported", "make them initializers")
    out_dtype = np.dtype(zero.dtype) if zero is not None else np.dtype(np.uint8)
    if node.attributes.get("output_dtype") is not None and zero is None:
        out_dtype = np.dtype({2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16}.get(int(ctx.attr(node, "output_dtype")), np.uint8))
    if out_dtype not in _RANGES:
        ctx.fail(node, f"quantising to {out_dtype} is not supported", "use int8 or uint8")
    low, high = _RANGES[out_dtype]
    rank = rank_of(x)
    axis = _axis(ctx, node, rank) if rank else 0
    block = int(ctx.attr(node, "block_size", 0))
    size = x.shape[axis] if rank else None
    inverse = _broadcast_param((1.0 / scale).astype(np.float32), rank, axis, block, size)
    scaled = mb.mul(x=x, y=inverse, name=ctx.name(node, "scaled"))
    rounded = mb.round(x=scaled, name=ctx.name(node, "rounded"))
    if zero is not None and np.any(zero):
        rounded = mb.add(x=rounded, y=_broadcast_param(zero.astype(np.float32), rank, axis, block, size),
                         name=ctx.name(node, "shifted"))
    clipped = mb.clip(x=rounded, alpha=np.float32(low), beta=np.float32(high), name=ctx.name(node, "saturated"))
    return mb.cast(x=clipped, dtype="int32", name=ctx.name(node))
