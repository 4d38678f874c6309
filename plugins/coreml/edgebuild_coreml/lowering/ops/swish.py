"""Swish (opset 24): ``x * sigmoid(alpha * x)``, and SwiGLU (opset 28): ``swish(a) * b``."""

from __future__ import annotations

from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import const_like
from edgebuild_coreml.lowering.registry import lowers


def _swish(x, alpha: float, **kwargs):
    gate = mb.sigmoid(x=x if alpha == 1.0 else mb.mul(x=x, y=const_like(alpha, x)))
    return mb.mul(x=x, y=gate, **kwargs)


@lowers("Swish", since=24)
def swish(ctx, node):
    return _swish(ctx.input(node, 0), float(ctx.attr(node, "alpha", 1.0)), name=ctx.name(node))


@lowers("SwiGLU", since=28)
def swiglu(ctx, node):
    gate = _swish(ctx.input(node, 0), float(ctx.attr(node, "alpha", 1.0)))
    return mb.mul(x=gate, y=ctx.input(node, 1), name=ctx.name(node))
