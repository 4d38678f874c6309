"""Activations: ONNX element-wise non-linearities onto MIL activation ops.

Where MIL's op differs from ONNX at a boundary (``thresholded_relu`` keeps ``x == alpha``,
ONNX zeroes it) the lowering spells out the ONNX formula instead.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._nn_util import as_float, fconst, is_float
from edgebuild_coreml.lowering.registry import lowers


def _x(ctx, node):
    return as_float(ctx.input(node, 0))


@lowers("Relu")
def relu(ctx, node):
    x = _x(ctx, node)
    if not is_float(x):  # integer Relu (opset 14+): max(x, 0)
        return mb.maximum(x=x, y=np.int32(0), name=ctx.name(node))
    return mb.relu(x=x, name=ctx.name(node))


@lowers("LeakyRelu")
def leaky_relu(ctx, node):
    return mb.leaky_relu(x=_x(ctx, node), alpha=float(ctx.attr(node, "alpha", 0.01)), name=ctx.name(node))


@lowers("PRelu")
def prelu(ctx, node):
    """x if x >= 0 else slope * x, with slope broadcast numpy-style (runtime slopes too)."""
    x, slope = _x(ctx, node), as_float(ctx.input(node, 1))
    positive = mb.relu(x=x, name=ctx.name(node, "pos"))
    negative = mb.minimum(x=x, y=fconst(x, 0.0), name=ctx.name(node, "neg"))
    scaled = mb.mul(x=negative, y=slope, name=ctx.name(node, "scaled"))
    return mb.add(x=positive, y=scaled, name=ctx.name(node))


@lowers("Elu")
def elu(ctx, node):
    return mb.elu(x=_x(ctx, node), alpha=float(ctx.attr(node, "alpha", 1.0)), name=ctx.name(node))


@lowers("Selu")
def selu(ctx, node):
    """gamma * elu(x, alpha)."""
    x = _x(ctx, node)
    alpha = float(ctx.attr(node, "alpha", 1.67326319217681884765625))
    gamma = float(ctx.attr(node, "gamma", 1.05070102214813232421875))
    inner = mb.elu(x=x, alpha=alpha, name=ctx.name(node, "elu"))
    return mb.mul(x=inner, y=fconst(x, gamma), name=ctx.name(node))


@lowers("Celu", since=12)
def celu(ctx, node):
    """alpha * elu(x / alpha)."""
    x = _x(ctx, node)
    alpha = float(ctx.attr(node, "alpha", 1.0))
    scaled = mb.mul(x=x, y=fconst(x, 1.0 / alpha), name=ctx.name(node, "scaled"))
    inner = mb.elu(x=scaled, alpha=1.0, name=ctx.name(node, "elu"))
    return mb.mul(x=inner, y=fconst(x, alpha), name=ctx.name(node))


@lowers("Sigmoid")
def sigmoid(ctx, node):
    return mb.sigmoid(x=_x(ctx, node), name=ctx.name(node))


@lowers("HardSigmoid")
def hard_sigmoid(ctx, node):
    alpha, beta = float(ctx.attr(node, "alpha", 0.2)), float(ctx.attr(node, "beta", 0.5))
    return mb.sigmoid_hard(x=_x(ctx, node), alpha=alpha, beta=beta, name=ctx.name(node))


@lowers("HardSwish", since=14)
def hard_swish(ctx, node):
    """x * hardsigmoid(x, 1/6, 1/2)."""
    x = _x(ctx, node)
    gate = mb.sigmoid_hard(x=x, alpha=1.0 / 6.0, beta=0.5, name=ctx.name(node, "gate"))
    return mb.mul(x=x, y=gate, name=ctx.name(node))


@lowers("Softplus")
def softplus(ctx, node):
    return mb.softplus(x=_x(ctx, node), name=ctx.name(node))


@lowers("Softsign")
def softsign(ctx, node):
    return mb.softsign(x=_x(ctx, node), name=ctx.name(node))


@lowers("Tanh")
def tanh(ctx, node):
    return mb.tanh(x=_x(ctx, node), name=ctx.name(node))


@lowers("ThresholdedRelu", since=10)
def thresholded_relu(ctx, node):
    """x if x > alpha else 0 (strict: MIL's thresholded_relu keeps x == alpha)."""
    x = _x(ctx, node)
    alpha = fconst(x, ctx.attr(node, "alpha", 1.0))
    keep = mb.greater(x=x, y=alpha, name=ctx.name(node, "keep"))
    return mb.select(cond=keep, a=x, b=fconst(x, 0.0), name=ctx.name(node))


@lowers("Gelu", since=20)
def gelu(ctx, node):
    approximate = ctx.attr(node, "approximate", "none")
    modes = {"none": "EXACT", "tanh": "TANH_APPROXIMATION"}
    if approximate not in modes:
        ctx.fail(node, f"approximate={approximate!r} is not an ONNX Gelu mode", "use 'none' or 'tanh'")
    return mb.gelu(x=_x(ctx, node), mode=modes[approximate], name=ctx.name(node))


@lowers("Mish", since=18)
def mish(ctx, node):
    """x * tanh(softplus(x))."""
    x = _x(ctx, node)
    soft = mb.softplus(x=x, name=ctx.name(node, "softplus"))
    gate = mb.tanh(x=soft, name=ctx.name(node, "tanh"))
    return mb.mul(x=x, y=gate, name=ctx.name(node))


@lowers("Clip", until=10)
def clip_bounds_attributes(ctx, node):
    low, high = ctx.attr(node, "min"), ctx.attr(node, "max")
    return _clip(ctx, node, None if low is None else np.float32(low), None if high is None else np.float32(high))


@lowers("Clip", since=11)
def clip_bounds_inputs(ctx, node):
    return _clip(ctx, node, ctx.input(node, 1, optional=True), ctx.input(node, 2, optional=True))


def _clip(ctx, node, low, high):
    """min(max(x, lo), hi); constant [0, 6] becomes relu6 and [0, inf) relu. The bounds are numpy
    constants, Vars, or None when unbounded on that side."""
    x = _x(ctx, node)
    if is_float(x):
        low = None if low is None else (fconst(x, low) if isinstance(low, (np.ndarray, np.generic)) else low)
        high = None if high is None else (fconst(x, high) if isinstance(high, (np.ndarray, np.generic)) else high)
    else:
        low = None if low is None else ctx.int32(low, node, "min") if isinstance(low, np.ndarray) else low
        high = None if high is None else ctx.int32(high, node, "max") if isinstance(high, np.ndarray) else high
    const_low = low if isinstance(low, np.ndarray) else None
    const_high = high if isinstance(high, np.ndarray) else None
    if is_float(x) and const_low is not None and const_low.size == 1 and float(const_low) == 0.0:
        if high is None:
            return mb.relu(x=x, name=ctx.name(node))
        if const_high is not None and const_high.size == 1 and float(const_high) == 6.0:
            return mb.relu6(x=x, name=ctx.name(node))
    if low is None and high is None:
        return mb.identity(x=x, name=ctx.name(node))
    if low is not None and high is None:
        return mb.maximum(x=x, y=low, name=ctx.name(node))
    if low is None:
        return mb.minimum(x=x, y=high, name=ctx.name(node))
    floored = mb.maximum(x=x, y=low, name=ctx.name(node, "lo"))
    return mb.minimum(x=floored, y=high, name=ctx.name(node))


@lowers("Shrink", since=9)
def shrink(ctx, node):
    """x + bias if x < -lambd; x - bias if x > lambd; else 0."""
    x = _x(ctx, node)
    lambd, bias = float(ctx.attr(node, "lambd", 0.5)), float(ctx.attr(node, "bias", 0.0))
    if not is_float(x):
        ctx.fail(node, "integer Shrink is not supported", "cast the input to float first")
    below = mb.less(x=x, y=fconst(x, -lambd), name=ctx.name(node, "below"))
    above = mb.greater(x=x, y=fconst(x, lambd), name=ctx.name(node, "above"))
    raised = mb.add(x=x, y=fconst(x, bias), name=ctx.name(node, "raised"))
    lowered = mb.sub(x=x, y=fconst(x, bias), name=ctx.name(node, "lowered"))
    upper = mb.select(cond=above, a=lowered, b=fconst(x, 0.0), name=ctx.name(node, "upper"))
    return mb.select(cond=below, a=raised, b=upper, name=ctx.name(node))


