"""Comparisons and boolean logic: Equal, Less(OrEqual), Greater(OrEqual), And, Or, Xor, Not, Where."""

from __future__ import annotations

from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._int_operands import compares_patterns, operand, unsigned_order
from edgebuild_coreml.lowering.ops._util import dtype_of, select
from edgebuild_coreml.lowering.registry import lowers

_COMPARE = {
    "Equal": mb.equal,
    "Less": mb.less,
    "LessOrEqual": mb.less_equal,
    "Greater": mb.greater,
    "GreaterOrEqual": mb.greater_equal,
}
_ORDER = {"Less": "less", "LessOrEqual": "less_equal", "Greater": "greater", "GreaterOrEqual": "greater_equal"}
_LOGIC = {"And": mb.logical_and, "Or": mb.logical_or, "Xor": mb.logical_xor}


@lowers(*_COMPARE)
def compare(ctx, node):
    unsigned = compares_patterns(node)  # uint32 values, held as int32 bit patterns
    x, y = operand(ctx, node, 0, patterns=unsigned), operand(ctx, node, 1, patterns=unsigned)
    if dtype_of(x) == "bool":  # Equal on bools: MIL compares numbers
        if node.op_type != "Equal":
            ctx.fail(node, "ordering comparisons of booleans are not defined")
        return mb.logical_not(x=mb.logical_xor(x=x, y=y), name=ctx.name(node))
    if unsigned and node.op_type in _ORDER:
        return unsigned_order(_ORDER[node.op_type], x, y, name=ctx.name(node))
    return _COMPARE[node.op_type](x=x, y=y, name=ctx.name(node))


@lowers(*_LOGIC)
def logic(ctx, node):
    return _LOGIC[node.op_type](x=ctx.input(node, 0), y=ctx.input(node, 1), name=ctx.name(node))


@lowers("Not")
def logical_not(ctx, node):
    return mb.logical_not(x=ctx.input(node, 0), name=ctx.name(node))


@lowers("Where")
def where(ctx, node):
    # a uint32 branch constant from 2**31 up is selected, not computed with: its bit pattern is its value
    cond, a, b = ctx.input(node, 0), operand(ctx, node, 1, patterns=True), operand(ctx, node, 2, patterns=True)
    return select(cond, a, b, name=ctx.name(node))
