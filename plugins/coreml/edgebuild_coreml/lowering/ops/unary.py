"""Elementwise unary math: Abs, Neg, Reciprocal, Sqrt, Exp, Log, rounding, trig, Erf, IsNaN, IsInf.

MIL's log/inverse add an epsilon by default; ONNX adds none, so it is set to zero or avoided.
MIL lacks asinh/acosh, which are built from their log identities.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._int_operands import is_unsigned, operand, within_width
from edgebuild_coreml.lowering.ops._util import const_like, dtype_of
from edgebuild_coreml.lowering.registry import lowers

_DIRECT = {
    "Abs": mb.abs,
    "Sqrt": mb.sqrt,
    "Exp": mb.exp,
    "Ceil": mb.ceil,
    "Floor": mb.floor,
    "Round": mb.round,  # both round half to even
    "Sign": mb.sign,
    "Sin": mb.sin,
    "Cos": mb.cos,
    "Tan": mb.tan,
    "Asin": mb.asin,
    "Acos": mb.acos,
    "Atan": mb.atan,
    "Sinh": mb.sinh,
    "Cosh": mb.cosh,
    "Atanh": mb.atanh,
    "Erf": mb.erf,
}
_INTEGER_OK = {"Abs", "Sign"}


@lowers(*_DIRECT)
def direct(ctx, node):
    x = operand(ctx, node, 0, patterns=node.op_type == "Abs")  # Abs of a uint32 pattern is the pattern
    if dtype_of(x) == "int32" and node.op_type == "Abs":
        if is_unsigned(node.inputs[0].dtype):  # a uint32 from 2**31 up is a negative pattern, its own magnitude
            return mb.identity(x=x, name=ctx.name(node))
        return within_width(ctx, node, lambda name: mb.abs(x=x, name=name))  # |-128| of an int8 wraps to -128
    if dtype_of(x) == "int32" and node.op_type not in _INTEGER_OK:
        if node.op_type in ("Ceil", "Floor", "Round"):
            return mb.identity(x=x, name=ctx.name(node))
        ctx.fail(node, f"{node.op_type} of an integer tensor has no Core ML equivalent")
    return _DIRECT[node.op_type](x=x, name=ctx.name(node))


@lowers("Neg")
def neg(ctx, node):
    x = operand(ctx, node, 0)
    if dtype_of(x) == "int32":  # -(-128) of an int8 wraps to -128
        return within_width(ctx, node, lambda name: mb.mul(x=x, y=const_like(-1, x), name=name))
    return mb.mul(x=x, y=const_like(-1, x), name=ctx.name(node))


@lowers("Reciprocal")
def reciprocal(ctx, node):
    x = ctx.input(node, 0)
    return mb.real_div(x=const_like(1, x), y=x, name=ctx.name(node))


@lowers("Log")
def log(ctx, node):
    x = ctx.input(node, 0)
    return mb.log(x=x, epsilon=const_like(0, x), name=ctx.name(node))


@lowers("Asinh", "Acosh")
def inverse_hyperbolic(ctx, node):
    # asinh(x) = log(x + sqrt(x^2 + 1)), acosh(x) = log(x + sqrt(x^2 - 1))
    x = ctx.input(node, 0)
    offset = 1 if node.op_type == "Asinh" else -1
    root = mb.sqrt(x=mb.add(x=mb.mul(x=x, y=x), y=const_like(offset, x)))
    if node.op_type == "Asinh":
        # log(|x| + sqrt(x^2+1)) with the sign restored keeps precision for negative x.
        magnitude = mb.log(x=mb.add(x=mb.abs(x=x), y=root), epsilon=const_like(0, x))
        return mb.mul(x=magnitude, y=mb.sign(x=x), name=ctx.name(node))
    return mb.log(x=mb.add(x=x, y=root), epsilon=const_like(0, x), name=ctx.name(node))


@lowers("IsNaN")
def is_nan(ctx, node):
    x = ctx.input(node, 0)
    return mb.not_equal(x=x, y=x, name=ctx.name(node))


@lowers("IsInf")
def is_inf(ctx, node):
    x = ctx.input(node, 0)
    positive = ctx.attr(node, "detect_positive", 1)
    negative = ctx.attr(node, "detect_negative", 1)
    if positive and negative:
        return mb.equal(x=mb.abs(x=x), y=const_like(np.inf, x), name=ctx.name(node))
    if positive:
        return mb.equal(x=x, y=const_like(np.inf, x), name=ctx.name(node))
    if negative:
        return mb.equal(x=x, y=const_like(-np.inf, x), name=ctx.name(node))
    # Neither sign detected: all false, shaped like x.
    return mb.logical_and(x=mb.equal(x=x, y=x), y=np.bool_(False), name=ctx.name(node))
