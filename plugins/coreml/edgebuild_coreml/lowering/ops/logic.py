"""Comparisons and boolean logic: Equal, Less(OrEqual), Greater(OrEqual), And, Or, Xor, Not, Where."""

from __future__ import annotations

from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import dtype_of, select
from edgebuild_coreml.lowering.registry import lowers

_COMPARE = {
    "Equal": mb.equal,
    "Less": mb.less,
    "LessOrEqual": mb.less_equal,
    "Greater": mb.greater,
    "GreaterOrEqual": mb.greater_equal,
}
_LOGIC = {"And": mb.logical_and, "Or": mb.logical_or, "Xor": mb.logical_xor}


@lowers(*_COMPARE)
def compare(ctx, node):
    x, y = ctx.input(node, 0), ctx.input(node, 1)
    if dtype_of(x) == "bool":  # Equal on bools: MIL compares numbers
        if node.op_type != "Equal":
            ctx.fail(node, "ordering comparisons of booleans are not defined")
        return mb.logical_not(x=mb.logical_xor(x=x, y=y), name=ctx.name(node))
    return _COMPARE[node.op_type](x=x, y=y, name=ctx.name(node))


@lowers(*_LOGIC)
def logic(ctx, node):
    return _LOGIC[node.op_type](x=ctx.input(node, 0), y=ctx.input(node, 1), name=ctx.name(node))


@lowers("Not")
def logical_not(ctx, node):
    return mb.logical_not(x=ctx.input(node, 0), name=ctx.name(node))


@lowers("Where")
def where(ctx, node):
    cond, a, b = ctx.input(node, 0), ctx.input(node, 1), ctx.input(node, 2)
    return select(cond, a, b, name=ctx.name(node))
