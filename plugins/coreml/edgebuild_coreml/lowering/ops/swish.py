"""Swish (opset 24): ``x * sigmoid(alpha * x)``."""

from __future__ import annotations

from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import const_like
from edgebuild_coreml.lowering.registry import lowers


@lowers("Swish", since=24)
def swish(ctx, node):
    x = ctx.input(node, 0)
    alpha = float(ctx.attr(node, "alpha", 1.0))
    gate = mb.sigmoid(x=x if alpha == 1.0 else mb.mul(x=x, y=const_like(alpha, x)))
    return mb.mul(x=x, y=gate, name=ctx.name(node))
