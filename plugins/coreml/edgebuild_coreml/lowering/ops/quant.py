"""QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear.

A DequantizeLinear of a constant int8/uint8 weight stays compressed in the artifact: it
becomes ``constexpr_blockwise_shift_scale`` (iOS18+, per-tensor, per-axis or blockwise) or
``constexpr_affine_dequantize`` (iOS16/17, per-tensor or per-axis), which Core ML expands at
load time. An int4/uint4 weight (ONNX opset 21) stays 4-bit behind
``constexpr_blockwise_shift_scale`` on iOS18+; older targets have no 4-bit constexpr op, so it
is folded to float and the lower stage says so in a note. Runtime tensors are (de)quantised
with float arithmetic; quantised values (4, 8 or 16 bits) travel as int32, the integer type
Core ML programs compute in. Scales and zero points may be runtime tensors when they are
per-tensor or per-axis (DynamicQuantizeLinear computes them).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types

from edgebuild_coreml.lowering.context import target_index
from edgebuild_coreml.lowering.ops._nn_util import as_float, rank_of, shape_of
from edgebuild_coreml.lowering.ops._util import dtype_of
from edgebuild_coreml.lowering.registry import lowers

# The integer types QuantizeLinear can saturate to, and their ranges.
_RANGES = {ir.DataType.INT2: (-2, 1), ir.DataType.UINT2: (0, 3), ir.DataType.INT4: (-8, 7), ir.DataType.UINT4: (0, 15), ir.DataType.INT8: (-128, 127),
           ir.DataType.UINT8: (0, 255), ir.DataType.INT16: (-32768, 32767), ir.DataType.UINT16: (0, 65535)}
_SUPPORTED = "use int2, uint2, int4, uint4, int8, uint8, int16 or uint16"
# Constant data a constexpr op can hold, as the numpy dtype coremltools reads it with.
_FOUR_BIT = {ir.DataType.INT4: types.np_int4_dtype, ir.DataType.UINT4: types.np_uint4_dtype}
_EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))


def _onnx_type(array: np.ndarray) -> ir.DataType | None:
    try:
        return ir.DataType.from_numpy(array.dtype)
    except (TypeError, ValueError):
        return None


def _is_runtime(value) -> bool:
    return value is not None and not isinstance(value, np.ndarray)


def _per_tensor(param) -> bool:
    """A scale/zero point with one element applies to the whole tensor (axis is ignored)."""
    size = 1
    for d in shape_of(param):
        size *= d if isinstance(d, (int, np.integer)) else 2  # symbolic: assume a vector
    return size == 1


def _broadcast_param(param, rank: int, axis: int, block: int, size: int | None, name: str):
    """Scale / zero point shaped to broadcast against the data (per-tensor, per-axis, blockwise).

    Runtime (Var) parameters are reshaped with MIL ops; blockwise runtime parameters are
    refused by the callers before this point.
    """
    if param is None:
        return None
    if _per_tensor(param):
        return np.asarray(param).reshape(()) if isinstance(param, np.ndarray) else param
    view = [1] * rank
    view[axis] = -1
    if not isinstance(param, np.ndarray):
        return mb.reshape(x=param, shape=np.array(view, np.int32), name=name)
    if block:
        param = np.repeat(param, block, axis=axis)
        if size is not None:
            param = np.take(param, np.arange(size), axis=axis)
        return param
    return param.reshape(view)


def _axis(ctx, node, rank: int, scale, block: int) -> int:
    """The quantisation axis, normalised; 0 (unused) for per-tensor parameters."""
    if not rank or (not block and _per_tensor(scale)):
        return 0
    axis = int(ctx.attr(node, "axis", 1))
    if not -rank <= axis < rank:
        ctx.fail(node, f"axis {axis} is out of range for a rank-{rank} input")
    return axis % rank


def _as_fp32(x, name: str):
    if isinstance(x, np.ndarray):
        return x.astype(np.float32)
    return x if dtype_of(x) == "fp32" else mb.cast(x=x, dtype="fp32", name=name)


def _refuse_runtime_blocks(ctx, node, block: int, *params) -> None:
    if block and any(_is_runtime(p) for p in params):
        ctx.fail(node, "blockwise quantisation with a runtime scale or zero point is not supported",
                 "make the scale and zero point initializers")


@lowers("DequantizeLinear", since=10)
def dequantize_linear(ctx, node):
    x = ctx.input(node, 0)
    scale = as_float(ctx.input(node, 1))
    zero = ctx.input(node, 2, optional=True)
    rank = rank_of(x)
    block = int(ctx.attr(node, "block_size", 0))
    axis = _axis(ctx, node, rank, scale, block)
    if isinstance(x, np.ndarray) and isinstance(scale, np.ndarray) and (zero is None or isinstance(zero, np.ndarray)):
        return _constant_weight(ctx, node, x, scale, zero, axis, block)
    _refuse_runtime_blocks(ctx, node, block, scale, zero)
    size = x.shape[axis] if rank else None
    values = _as_fp32(x, ctx.name(node, "as_float"))
    if zero is not None and (_is_runtime(zero) or np.any(zero)):
        offset = _broadcast_param(_as_fp32(zero, ctx.name(node, "zero_float")), rank, axis, block, size,
                                  ctx.name(node, "zero_view"))
        values = mb.sub(x=values, y=offset, name=ctx.name(node, "centred"))
    if isinstance(scale, np.ndarray) and np.all(scale == 1):  # the integer values themselves (integer-exact sums)
        return mb.identity(x=values, name=ctx.name(node))
    factor = _broadcast_param(_as_fp32(scale, ctx.name(node, "scale_float")), rank, axis, block, size,
                              ctx.name(node, "scale_view"))
    return mb.mul(x=values, y=factor, name=ctx.name(node))


def _constant_weight(ctx, node, data, scale, zero, axis, block):
    """Keep an int4/uint4/int8/uint8 constant compressed behind a constexpr op when the target allows."""
    rank = data.ndim
    zero = np.zeros((), data.dtype) if zero is None else zero.astype(data.dtype)
    four_bit = _FOUR_BIT.get(_onnx_type(data))
    compressible = (four_bit is not None or data.dtype in _EIGHT_BIT) and rank >= 1
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
        if four_bit is not None:  # coremltools reads 4-bit data from int8/uint8 arrays tagged with its type
            data, zero = (np.ascontiguousarray(a).astype(np.int8 if four_bit.kind == "i" else np.uint8).astype(four_bit)
                          for a in (data, zero))
        return mb.constexpr_blockwise_shift_scale(
            data=data, scale=scale.astype(np.float32), offset=np.ascontiguousarray(zero), name=ctx.name(node)
        )
    if compressible and four_bit is None and not block and target_index(ctx.target) >= target_index("iOS16"):
        return mb.constexpr_affine_dequantize(
            quantized_data=data, zero_point=zero.reshape(-1) if zero.size > 1 else zero.reshape(()),
            scale=scale.astype(np.float32).reshape(-1) if scale.size > 1 else scale.astype(np.float32).reshape(()),
            axis=axis, name=ctx.name(node),
        )
    if four_bit is not None:
        ctx.note(f"4-bit weights were stored as float: Core ML holds them 4-bit from iOS18 "
                 f"(the recipe targets {ctx.target}); set target.deployment_target: iOS18 to keep them compressed")
    # Older targets, int32/int16 data or blockwise before iOS18: fold to a float constant.
    size = data.shape[axis] if rank else None
    offset = _broadcast_param(zero.astype(np.float32), rank, axis, block, size, "")
    factor = _broadcast_param(scale.astype(np.float32), rank, axis, block, size, "")
    return ((data.astype(np.float32) - offset) * factor).astype(np.float32)


def _quantized_type(ctx, node, zero) -> ir.DataType:
    """The integer type QuantizeLinear saturates to: the output's declared type when known."""
    declared = node.outputs[0].dtype
    if declared in _RANGES:
        return declared
    if node.attributes.get("output_dtype") is not None:
        code = ir.DataType(int(ctx.attr(node, "output_dtype")))
        if code not in _RANGES:
            ctx.fail(node, f"quantising to {code.name} is not supported", _SUPPORTED)
        return code
    if isinstance(zero, np.ndarray):
        found = _onnx_type(zero)
    else:
        found = node.inputs[2].dtype if ctx.has_input(node, 2) else ir.DataType.UINT8
    if found not in _RANGES:
        ctx.fail(node, f"quantising to {found} is not supported", _SUPPORTED)
    return found


@lowers("QuantizeLinear", since=10)
def quantize_linear(ctx, node):
    """saturate(round_half_even(x / scale) + zero_point), as int32 values."""
    x = _as_fp32(as_float(ctx.input(node, 0)), ctx.name(node, "as_float"))
    scale = as_float(ctx.input(node, 1))
    zero = ctx.input(node, 2, optional=True)
    out_type = _quantized_type(ctx, node, zero)
    rank = rank_of(x)
    block = int(ctx.attr(node, "block_size", 0))
    axis = _axis(ctx, node, rank, scale, block)
    _refuse_runtime_blocks(ctx, node, block, scale, zero)
    size = x.shape[axis] if rank else None
    factor = _broadcast_param(_as_fp32(scale, ctx.name(node, "scale_float")), rank, axis, block, size,
                              ctx.name(node, "scale_view"))
    offset = None
    if zero is not None and (_is_runtime(zero) or np.any(zero)):
        offset = _broadcast_param(_as_fp32(zero, ctx.name(node, "zero_float")), rank, axis, block, size,
                                  ctx.name(node, "zero_view"))
    return _quantize(ctx, node, x, factor, offset, _RANGES[out_type], ctx.name(node))


FP16_NOTE = ("quantised arithmetic is not integer-exact at float16: the quantisers read fp16 values and the "
             "integer sums are rounded to fp16, so the outputs agree with onnxruntime's integer kernels only "
             "approximately; build at float32 for onnxruntime's exact arithmetic")


def _quantize(ctx, node, x, scale, offset, bounds, name: str):
    """clip(round_half_even(x / scale) + offset, low, high) as int32 (``offset`` may be None)."""
    if ctx.precision == "float16":
        ctx.note(FP16_NOTE)
    scaled = mb.real_div(x=x, y=scale, name=ctx.name(node, "scaled"))
    rounded = mb.round(x=scaled, name=ctx.name(node, "rounded"))
    if offset is not None:
        rounded = mb.add(x=rounded, y=offset, name=ctx.name(node, "shifted"))
    low, high = bounds
    clipped = mb.clip(x=rounded, alpha=np.float32(low), beta=np.float32(high), name=ctx.name(node, "saturated"))
    return mb.cast(x=clipped, dtype="int32", name=name)


RUNTIME_QUANT_NOTE = ("the graph quantises at run time (DynamicQuantizeLinear) values that float ops with "
                      "implementation-defined rounding compute (LayerNormalization, Softmax, Erf, float matmuls, ...): "
                      "a last-bit difference there can move a value across a rounding tie, or move the tensor's range "
                      "and with it its scale, and later layers carry the step on, so agreement with onnxruntime is "
                      "not bit-exact and falls with depth (onnxruntime's own optimised and unoptimised sessions "
                      "differ so); the quantised arithmetic itself is onnxruntime's")
# Ops whose float result is the same in every correct implementation: IEEE-rounded elementwise
# arithmetic, data movement and the (de)quantisers; a quantiser fed only through these reads
# exactly what onnxruntime's reads.
_EXACT_OPS = {"Add", "Sub", "Mul", "Div", "Neg", "Abs", "Relu", "Max", "Min", "Clip", "Sqrt", "Where",
              "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Cast", "Concat", "Split",
              "Slice", "Gather", "Expand", "Pad", "DequantizeLinear", "QuantizeLinear", "DynamicQuantizeLinear"}
# Products of integer-valued operands (the decomposed quantised matmuls) are exact sums.
_INTEGER_PRODUCT_OPS = {"MatMul", "Linear", "Conv", "Gemm", "MatMulInteger", "ConvInteger"}


def _reads_implementation_rounding(value) -> bool:
    """Whether ``value`` is computed, somewhere upstream, by a float op whose last bit depends on
    the implementation (a reduction other than an integer-valued product, a transcendental)."""
    seen, pending = set(), [value]
    while pending:
        producer = pending.pop().producer()
        if producer is None or id(producer) in seen:
            continue
        seen.add(id(producer))
        inputs = [v for v in producer.inputs if v is not None]
        if producer.op_type in _INTEGER_PRODUCT_OPS:
            if not all(v.producer() is None or v.producer().op_type in ("DequantizeLinear", "Cast")
                       for v in inputs):
                return True
        elif producer.op_type not in _EXACT_OPS:
            return True
        pending.extend(inputs)
    return False


@lowers("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(ctx, node):
    """uint8 quantisation with scale and zero point taken from the data's range (which
    always includes 0): scale = (max - min) / 255, zero point = saturate(round(-min / scale)).

    An all-zero tensor gets scale 1 (and zero point 0), as onnxruntime gives it: the formula's
    0 / 0 would make every quantised value NaN (an LSTM's zero initial state quantises so)."""
    if _reads_implementation_rounding(node.inputs[0]):
        ctx.note(RUNTIME_QUANT_NOTE)
    x = _as_fp32(as_float(ctx.input(node, 0)), ctx.name(node, "as_float"))
    low, high = _RANGES[ir.DataType.UINT8]
    top = mb.maximum(x=mb.reduce_max(x=x, keep_dims=False, name=ctx.name(node, "max")), y=np.float32(0),
                     name=ctx.name(node, "max_with_zero"))
    bottom = mb.minimum(x=mb.reduce_min(x=x, keep_dims=False, name=ctx.name(node, "min")), y=np.float32(0),
                        name=ctx.name(node, "min_with_zero"))
    spread = mb.sub(x=top, y=bottom, name=ctx.name(node, "spread"))
    steps = mb.real_div(x=spread, y=np.float32(high - low), name=ctx.name(node, "range_over_steps"))
    flat = mb.equal(x=spread, y=np.float32(0), name=ctx.name(node, "all_zero"))
    scale = mb.select(cond=flat, a=np.float32(1), b=steps, name=ctx.name(node, "scale"))
    shift = mb.real_div(x=bottom, y=scale, name=ctx.name(node, "min_over_scale"))
    zero_float = mb.clip(x=mb.round(x=mb.sub(x=np.float32(low), y=shift, name=ctx.name(node, "zero_exact")),
                                    name=ctx.name(node, "zero_rounded")),
                         alpha=np.float32(low), beta=np.float32(high), name=ctx.name(node, "zero_saturated"))
    y = _quantize(ctx, node, x, scale, zero_float, (low, high), ctx.name(node))
    zero = mb.cast(x=zero_float, dtype="int32", name=ctx.name(node, "zero_point"))
    return y, mb.identity(x=scale, name=ctx.name(node, "y_scale")), zero
