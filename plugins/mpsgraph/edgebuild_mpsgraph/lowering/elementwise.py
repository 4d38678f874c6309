"""Elementwise and activation ops (ai.onnx and the edgebuild:: fused activations)."""

from __future__ import annotations

import math

import numpy as np

from edgebuild_mpsgraph.lowering.registry import lowers

BINARY = {"Add": "addition", "Sub": "subtraction", "Mul": "multiplication", "Div": "division", "Pow": "power",
          "Max": "maximum", "Min": "minimum", "Equal": "equal", "Greater": "greaterThan", "Less": "lessThan",
          "GreaterOrEqual": "greaterThanOrEqualTo", "LessOrEqual": "lessThanOrEqualTo", "And": "logicalAND",
          "Or": "logicalOR"}
UNARY = {"Relu": "reLU", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exponent", "Log": "logarithm",
         "Sqrt": "squareRoot", "Reciprocal": "reciprocal", "Abs": "absolute", "Neg": "negative", "Floor": "floor",
         "Ceil": "ceil", "Erf": "erf", "Sin": "sin", "Cos": "cos", "Not": "not", "Identity": "identity",
         "Dropout": "identity"}


def _binary(op):
    def lower(ctx, node):
        a, b = ctx.input(node, 0), ctx.input(node, 1)
        if op == "power" and ctx.dtype(b) != ctx.dtype(a):
            b = ctx.emit("cast", [b], dataType=ctx.dtype(a))
        return ctx.emit(op, [a, b])

    return lower


def _unary(op):
    def lower(ctx, node):
        x = ctx.input(node, 0)
        if op == "identity" and node.op_type == "Identity":
            return x  # an alias: no op
        return ctx.emit(op, [x])

    return lower


for _onnx, _mps in BINARY.items():
    lowers(_onnx)(_binary(_mps))
for _onnx, _mps in UNARY.items():
    lowers(_onnx)(_unary(_mps))


@lowers("Sum")
def lower_sum(ctx, node):
    total = ctx.input(node, 0)
    for i in range(1, len(node.inputs)):
        total = ctx.emit("addition", [total, ctx.input(node, i)])
    return total


@lowers("LeakyRelu")
def lower_leaky_relu(ctx, node):
    return ctx.emit("leakyReLU", [ctx.input(node, 0)], alpha=float(ctx.attr(node, "alpha", 0.01)))


def _clamp(ctx, x, low, high):
    return ctx.emit("clamp", [x, ctx.scalar(low, x), ctx.scalar(high, x)])


def _hard_sigmoid(ctx, x, alpha: float, beta: float):
    """clamp(alpha * x + beta, 0, 1): MPSGraph has no hardSigmoid op."""
    scaled = ctx.emit("addition", [ctx.emit("multiplication", [x, ctx.scalar(alpha, x)]), ctx.scalar(beta, x)])
    return _clamp(ctx, scaled, 0.0, 1.0)


@lowers("HardSigmoid")
def lower_hard_sigmoid(ctx, node):
    return _hard_sigmoid(ctx, ctx.input(node, 0), float(ctx.attr(node, "alpha", 0.2)), float(ctx.attr(node, "beta", 0.5)))


@lowers("HardSwish")
def lower_hard_swish(ctx, node):
    x = ctx.input(node, 0)
    return ctx.emit("multiplication", [x, _hard_sigmoid(ctx, x, 1.0 / 6.0, 0.5)])


@lowers("Clip", until=10)
def lower_clip_bounds_attributes(ctx, node):
    return _clip(ctx, node, ctx.attr(node, "min", None), ctx.attr(node, "max", None))


@lowers("Clip", since=11)
def lower_clip_bounds_inputs(ctx, node):
    low = ctx.const(node, 1) if ctx.has_input(node, 1) else None
    high = ctx.const(node, 2) if ctx.has_input(node, 2) else None
    return _clip(ctx, node, low, high)


def _clip(ctx, node, low, high):
    """min(max(x, low), high); a bound of None is the dtype's own limit."""
    x = ctx.input(node, 0)
    info = np.finfo if np.issubdtype(np.dtype(ctx.dtype(x)), np.floating) else np.iinfo
    low = info(ctx.dtype(x)).min if low is None else low
    high = info(ctx.dtype(x)).max if high is None else high
    return _clamp(ctx, x, low, high)


@lowers("Where")
def lower_where(ctx, node):
    return ctx.emit("select", [ctx.input(node, 0), ctx.input(node, 1), ctx.input(node, 2)])


@lowers("Cast")
def lower_cast(ctx, node):
    import onnx_ir as ir

    to = ir.DataType(ctx.attr(node, "to"))
    return ctx.emit("cast", [ctx.input(node, 0)], dataType=np.dtype(to.numpy()).name)


@lowers("Silu", domain="edgebuild")
def lower_silu(ctx, node):
    x = ctx.input(node, 0)
    return ctx.emit("multiplication", [x, ctx.emit("sigmoid", [x])])


def _gelu(ctx, x, approximate: str):
    half_x = ctx.emit("multiplication", [x, ctx.scalar(0.5, x)])
    if approximate == "tanh":
        cube = ctx.emit("multiplication", [ctx.emit("multiplication", [x, x]), x])
        inner = ctx.emit("addition", [x, ctx.emit("multiplication", [cube, ctx.scalar(0.044715, x)])])
        core = ctx.emit("tanh", [ctx.emit("multiplication", [inner, ctx.scalar(math.sqrt(2.0 / math.pi), x)])])
    else:
        core = ctx.emit("erf", [ctx.emit("multiplication", [x, ctx.scalar(1.0 / math.sqrt(2.0), x)])])
    return ctx.emit("multiplication", [half_x, ctx.emit("addition", [core, ctx.scalar(1.0, x)])])


@lowers("Gelu", domain="edgebuild")
def lower_fused_gelu(ctx, node):
    return _gelu(ctx, ctx.input(node, 0), ctx.attr(node, "approximate", "none"))


@lowers("Gelu", since=20)
def lower_gelu(ctx, node):
    return _gelu(ctx, ctx.input(node, 0), ctx.attr(node, "approximate", "none"))
