"""Elementwise binary and variadic math: Add, Sub, Mul, Div, Pow, Mod, Max, Min, Sum, Mean.

ONNX and MIL broadcast the same way (numpy rules). Where the semantics differ — integer
Div truncates toward zero, Mod with ``fmod=1`` takes the dividend's sign — extra ops fix it.
Integer operands of every width compute in int32 (``_int_operands``); a sum, difference,
product or quotient of a narrower type wraps into it, as onnxruntime's kernels do, and uint32
bit patterns divide unsigned (``_unsigned_div``).
"""

from __future__ import annotations

from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._int_operands import (compares_patterns, operand, operands, unsigned_order,
                                                          within_width)
from edgebuild_coreml.lowering.ops._unsigned_div import unsigned_divmod
from edgebuild_coreml.lowering.ops._util import const_like, dtype_of, select
from edgebuild_coreml.lowering.registry import lowers

_SIMPLE = {"Add": mb.add, "Sub": mb.sub, "Mul": mb.mul}


@lowers("Add", "Sub", "Mul")
def arithmetic(ctx, node):
    x, y = operand(ctx, node, 0), operand(ctx, node, 1)
    if dtype_of(x) == "bool":  # not valid ONNX, but cheap to reject clearly
        ctx.fail(node, "boolean arithmetic is not defined")
    if dtype_of(x) != "int32":
        return _SIMPLE[node.op_type](x=x, y=y, name=ctx.name(node))
    return within_width(ctx, node, lambda name: _SIMPLE[node.op_type](x=x, y=y, name=name))


@lowers("Div")
def div(ctx, node):
    unsigned = compares_patterns(node)  # uint32 patterns divide unsigned
    x, y = operand(ctx, node, 0, patterns=unsigned), operand(ctx, node, 1, patterns=unsigned)
    if dtype_of(x) != "int32":
        return mb.real_div(x=x, y=y, name=ctx.name(node))
    if unsigned:
        return mb.identity(x=unsigned_divmod(x, y)[0], name=ctx.name(node))
    return within_width(ctx, node, lambda name: _truncating_div(ctx, node, x, y, name))  # int8 -128 / -1 wraps


def _truncating_div(ctx, node, x, y, name):
    # ONNX integer division truncates toward zero; MIL floor_div floors. Step the
    # quotient back up by one where there is a remainder and the signs differ.
    floored = mb.floor_div(x=x, y=y, name=ctx.name(node, "floor"))
    remainder = mb.sub(x=x, y=mb.mul(x=floored, y=y), name=ctx.name(node, "rem"))
    zero = const_like(0, x)
    inexact = mb.not_equal(x=remainder, y=zero)
    signs_differ = mb.logical_xor(x=mb.less(x=x, y=zero), y=mb.less(x=y, y=zero))
    adjust = mb.cast(x=mb.logical_and(x=inexact, y=signs_differ), dtype="int32")
    return mb.add(x=floored, y=adjust, name=name)


@lowers("Pow")
def power(ctx, node):
    x, y = ctx.input(node, 0), ctx.input(node, 1)
    if dtype_of(y) != dtype_of(x):  # ONNX allows e.g. a float base with an int exponent
        y = mb.cast(x=y, dtype=dtype_of(x), name=ctx.name(node, "exponent"))
    if dtype_of(x) == "int32":
        # MIL pow is floating point only; integer results are exact below 2**24.
        result = mb.pow(x=mb.cast(x=x, dtype="fp32"), y=mb.cast(x=y, dtype="fp32"))
        return mb.cast(x=mb.round(x=result), dtype="int32", name=ctx.name(node))
    return mb.pow(x=x, y=y, name=ctx.name(node))


@lowers("Mod", until=27)
def mod_integer_floor(ctx, node):
    """Before opset 28, Mod with fmod=0 is defined for integers only."""
    if not ctx.attr(node, "fmod", 0) and dtype_of(operand(ctx, node, 0, patterns=True)) != "int32":
        ctx.fail(node, "Mod with fmod=0 is defined for integers only before opset 28",
                 hint="set fmod=1 for floats")
    return mod(ctx, node)


@lowers("Mod", since=28)
def mod(ctx, node):
    unsigned = compares_patterns(node)
    x, y = operand(ctx, node, 0, patterns=unsigned), operand(ctx, node, 1, patterns=unsigned)
    if unsigned and dtype_of(x) == "int32":  # no signs: both fmod modes are the unsigned remainder
        return mb.identity(x=unsigned_divmod(x, y)[1], name=ctx.name(node))
    if not ctx.attr(node, "fmod", 0):  # the result takes the divisor's sign, as MIL mod's does
        return mb.mod(x=x, y=y, name=ctx.name(node))
    # C fmod: the result takes the dividend's sign. MIL mod takes the divisor's, so where a
    # nonzero result has the wrong sign, shift it by one divisor.
    floored = mb.mod(x=x, y=y, name=ctx.name(node, "floored"))
    zero = const_like(0, x)
    nonzero = mb.not_equal(x=floored, y=zero)
    wrong_sign = mb.logical_xor(x=mb.less(x=floored, y=zero), y=mb.less(x=x, y=zero))
    shifted = mb.sub(x=floored, y=y)
    return mb.select(cond=mb.logical_and(x=nonzero, y=wrong_sign), a=shifted, b=floored, name=ctx.name(node))


_FOLD = {"Max": mb.maximum, "Min": mb.minimum, "Sum": mb.add, "Mean": mb.add}


@lowers("Max", "Min", "Sum", "Mean")
def variadic(ctx, node):
    unsigned = node.op_type in ("Max", "Min") and compares_patterns(node)  # uint32 patterns order unsigned
    values = operands(ctx, node, patterns=unsigned)
    if not values:
        ctx.fail(node, "needs at least one input")
    op = _unsigned_extreme(node.op_type) if unsigned else _FOLD[node.op_type]
    if len(values) == 1:
        result = mb.identity(x=values[0], name=ctx.name(node)) if node.op_type != "Mean" else values[0]
        if node.op_type != "Mean":
            return result
    else:
        result = _fold(ctx, node, values, op, ctx.name(node) if node.op_type != "Mean" else ctx.name(node, "sum"))
    if node.op_type == "Mean":
        return mb.real_div(x=result, y=const_like(len(values), result), name=ctx.name(node))
    return result


def _fold(ctx, node, values, op, name):
    result = values[0]
    for i, value in enumerate(values[1:]):
        result = op(x=result, y=value, name=name if i == len(values) - 2 else ctx.name(node, f"acc{i}"))
    return result


def _unsigned_extreme(op_type):
    """Max or Min of uint32 bit patterns (the larger or smaller unsigned value)."""
    def extreme(x, y, name):
        smaller = unsigned_order("less", x, y)
        return select(smaller, y, x, name=name) if op_type == "Max" else select(smaller, x, y, name=name)
    return extreme
