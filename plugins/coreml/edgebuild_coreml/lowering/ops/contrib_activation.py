"""Activations of onnxruntime's transformer optimiser: Gelu, BiasGelu, FastGelu, QuickGelu,
and BiasAdd (the residual add that travels with them).

FastGelu's constants (0.797885 = sqrt(2/pi), 0.035677 = 0.044715 * sqrt(2/pi)) are GELU's tanh
approximation, which MIL's gelu computes as TANH_APPROXIMATION.
"""

from __future__ import annotations

from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._nn_util import as_float, fconst
from edgebuild_coreml.lowering.registry import lowers

DOMAIN = "com.microsoft"
QUICK_GELU_ALPHA = 1.702  # onnxruntime's schema default


def _biased(ctx, node, bias_index: int, *, optional: bool):
    """input 0, plus the bias at ``bias_index`` when there is one."""
    x = as_float(ctx.input(node, 0))
    bias = as_float(ctx.input(node, bias_index, optional=optional))
    return x if bias is None else mb.add(x=x, y=bias, name=ctx.name(node, "biased"))


@lowers("Gelu", domain=DOMAIN)
def gelu(ctx, node):
    """0.5 * x * (1 + erf(x / sqrt(2)))."""
    return mb.gelu(x=as_float(ctx.input(node, 0)), mode="EXACT", name=ctx.name(node))


@lowers("BiasGelu", domain=DOMAIN)
def bias_gelu(ctx, node):
    """Gelu(A + B), B a bias broadcast over the last axis."""
    return mb.gelu(x=_biased(ctx, node, 1, optional=False), mode="EXACT", name=ctx.name(node))


@lowers("FastGelu", domain=DOMAIN)
def fast_gelu(ctx, node):
    """Gelu's tanh approximation of X (+ bias)."""
    return mb.gelu(x=_biased(ctx, node, 1, optional=True), mode="TANH_APPROXIMATION", name=ctx.name(node))


@lowers("QuickGelu", domain=DOMAIN)
def quick_gelu(ctx, node):
    """x * sigmoid(alpha * x)."""
    x = as_float(ctx.input(node, 0))
    alpha = float(ctx.attr(node, "alpha", QUICK_GELU_ALPHA))
    scaled = x if alpha == 1.0 else mb.mul(x=x, y=fconst(x, alpha), name=ctx.name(node, "scaled"))
    gate = mb.sigmoid(x=scaled, name=ctx.name(node, "gate"))
    return mb.mul(x=x, y=gate, name=ctx.name(node))


@lowers("BiasAdd", domain=DOMAIN)
def bias_add(ctx, node):
    """X + bias + skip (X and skip (N, S, C), bias (C))."""
    biased = _biased(ctx, node, 1, optional=False)
    return mb.add(x=biased, y=as_float(ctx.input(node, 2)), name=ctx.name(node))
