"""Elementwise ops. MPSGraph broadcasts binary operands numpy-style; so do these."""

from __future__ import annotations

import numpy as np

from edgebuild.plugin.reference import activations, special
from edgebuild_mpsgraph.executor.registry import evaluates

_BINARY = {
    "addition": np.add, "subtraction": np.subtract, "multiplication": np.multiply,
    "maximum": np.maximum, "minimum": np.minimum, "power": np.power,
    "equal": np.equal, "notEqual": np.not_equal, "greaterThan": np.greater,
    "greaterThanOrEqualTo": np.greater_equal, "lessThan": np.less, "lessThanOrEqualTo": np.less_equal,
    "logicalAND": np.logical_and, "logicalOR": np.logical_or,
}


_UNARY = {
    "identity": lambda x: x, "absolute": np.abs, "negative": np.negative, "exponent": np.exp,
    "logarithm": np.log, "squareRoot": np.sqrt, "reciprocalSquareRoot": lambda x: 1 / np.sqrt(x),
    "reciprocal": lambda x: 1 / x, "floor": np.floor, "ceil": np.ceil, "sin": np.sin, "cos": np.cos,
    "tanh": np.tanh, "erf": special.erf, "not": np.logical_not,
    "reLU": lambda x: np.maximum(x, np.zeros((), x.dtype)),
    "sigmoid": activations.sigmoid,
}


def _binary(fn):
    def evaluate(a, b, **_):
        result = fn(a, b)
        return [result if result.dtype == np.bool_ else result.astype(np.result_type(a, b), copy=False)]

    return evaluate


def _unary(fn):
    def evaluate(x, **_):
        result = np.asarray(fn(x))
        return [result if result.dtype == np.bool_ else result.astype(x.dtype, copy=False)]

    return evaluate


for _name, _fn in _BINARY.items():
    evaluates(_name)(_binary(_fn))
for _name, _fn in _UNARY.items():
    evaluates(_name)(_unary(_fn))


@evaluates("division")
def division(a, b, **_):
    if np.issubdtype(a.dtype, np.integer):  # integer division truncates toward zero, as ONNX Div does
        return [np.trunc(a / b).astype(a.dtype)]
    return [(a / b).astype(np.result_type(a, b))]


@evaluates("leakyReLU")
def leaky_relu(x, *, alpha: float, **_):
    return [activations.leaky_relu(x, alpha)]


@evaluates("clamp")
def clamp(x, low, high, **_):
    return [np.minimum(np.maximum(x, low), high).astype(x.dtype)]


@evaluates("select")
def select(predicate, true_value, false_value, **_):
    return [np.where(predicate.astype(bool), true_value, false_value)]


@evaluates("cast")
def cast(x, *, dataType: str, **_):
    return [x.astype(np.dtype(dataType))]
