"""Cast, CastLike, Identity and inference-mode Dropout.

Every ONNX integer type computes as int32 in Core ML (no int64), and float64 as fp32.
Casting a constant stays a numpy constant so shape arithmetic keeps folding.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._int_width import WIDTHS, fits, wrap, wrap_numpy
from edgebuild_coreml.lowering.ops._util import dtype_of, mil_dtype, shape_tensor, wanted
from edgebuild.plugin import NotRepresentable
from edgebuild_coreml.lowering.registry import lowers


def _cast_to(ctx, node, onnx_dtype: ir.DataType):
    onnx_dtype = ir.DataType(onnx_dtype)
    target = mil_dtype(onnx_dtype)
    if target is None:
        ctx.fail(node, f"Core ML has no {onnx_dtype.name} tensors", hint="cast to float32 or int32")
    value = ctx.const_value(node.inputs[0])
    if value is not None and value.size <= 4096:  # fold small constants, keep ONNX's dtype
        return _folded(np.asarray(value), onnx_dtype)
    x = ctx.input(node, 0)
    # A narrower integer type is carried in int32: what does not fit wraps, as ONNX's
    # fixed-point casts discard the higher bits (float -> int truncates first).
    bits, signed = WIDTHS.get(onnx_dtype, (32, True))
    if bits < 32 and not fits(node.inputs[0].dtype, onnx_dtype):
        as_int = x if dtype_of(x) == "int32" else mb.cast(x=x, dtype="int32", name=ctx.name(node, "int32"))
        return wrap(as_int, bits, signed, name=ctx.name(node))
    if dtype_of(x) == target:
        return mb.identity(x=x, name=ctx.name(node))
    return mb.cast(x=x, dtype=target, name=ctx.name(node))


def _folded(value: np.ndarray, onnx_dtype: ir.DataType) -> np.ndarray:
    """A constant cast at build time; integer types narrower than a byte are held in (u)int8."""
    if onnx_dtype not in WIDTHS:
        return value.astype(onnx_dtype.numpy())
    bits, signed = WIDTHS[onnx_dtype]
    is_float = value.dtype.kind == "f" or "float" in value.dtype.name
    ints = np.trunc(value.astype(np.float64)).astype(np.int64) if is_float else value.astype(np.int64)
    wrapped = wrap_numpy(ints, bits, signed)
    if bits < 8:
        return wrapped.astype(np.int8 if signed else np.uint8)
    return wrapped.astype(onnx_dtype.numpy())


@lowers("Cast")
def cast(ctx, node):
    return _cast_to(ctx, node, ir.DataType(ctx.attr(node, "to")))


_ONNX_OF_MIL = {"fp32": ir.DataType.FLOAT, "fp16": ir.DataType.FLOAT16, "int32": ir.DataType.INT32,
                "bool": ir.DataType.BOOL}


@lowers("CastLike")
def cast_like(ctx, node):
    like = node.inputs[1]
    if like.dtype is not None:
        return _cast_to(ctx, node, like.dtype)
    # No ONNX type recorded (no shape inference ran): the lowered value's dtype says it.
    found = ctx.get(like)
    if not isinstance(found, np.ndarray):
        return _cast_to(ctx, node, _ONNX_OF_MIL[dtype_of(found)])
    return _cast_to(ctx, node, ir.DataType.from_numpy(found.dtype))


@lowers("Identity")
def identity(ctx, node):
    x = ctx.input(node, 0)
    return mb.identity(x=x, name=ctx.name(node))


@lowers("Dropout")
def dropout(ctx, node):
    """Inference: the output is the input, and the optional mask is all true."""
    x = ctx.input(node, 0)
    if ctx.has_input(node, 2):
        training = ctx.const(node, 2, what="training_mode")
        ratio = ctx.const(node, 1, optional=True, what="ratio")
        if bool(np.asarray(training).reshape(-1)[0]) and (ratio is None or float(np.asarray(ratio).reshape(-1)[0]) > 0):
            raise NotRepresentable(
                f"{ctx.where(node)}: training_mode=true drops random elements, which an inference model "
                "cannot reproduce", hint="export the model in eval mode")
    y = mb.identity(x=x, name=ctx.name(node))
    if len(node.outputs) < 2 or not wanted(node.outputs[1]):
        return y
    ones = mb.fill(shape=shape_tensor(x), value=1.0, name=ctx.name(node, "ones"))
    return y, mb.cast(x=ones, dtype="bool", name=ctx.name(node, "mask"))
