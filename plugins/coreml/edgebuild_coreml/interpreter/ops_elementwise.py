"""Elementwise MIL ops: binary arithmetic/comparison/logic, unary math, cast.

Semantics follow the MIL op docs (coremltools ``ops/defs/iOS15..iOS17``). Inputs keep their
dtype, so fp16 operands compute as numpy fp16 (each op rounded to fp16, as on device).
"""

from __future__ import annotations

import numpy as np

from edgebuild.plugin.reference import special

from . import torch_kernels as kernels
from ._params import per_op
from .registry import evaluates


def _floor_div(x, y):
    if np.issubdtype(np.result_type(x, y), np.integer):
        return np.floor_divide(x, y)
    return np.floor(np.true_divide(x, y))


def _power(x, y):
    # numpy refuses integer ** negative integer; MIL defines it through real values.
    if np.issubdtype(np.result_type(x, y), np.integer) and np.any(np.asarray(y) < 0):
        return np.power(np.asarray(x, np.float64), y)
    return np.power(x, y)


_BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "real_div": np.true_divide,
    "floor_div": _floor_div,
    "mod": np.mod,  # sign follows the divisor, as Python's % (and torch.remainder)
    "pow": _power,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "equal": np.equal,
    "not_equal": np.not_equal,
    "less": np.less,
    "less_equal": np.less_equal,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
    "logical_xor": np.logical_xor,
}


_KEEPS_FLOAT_TYPE = ("add", "sub", "mul", "real_div", "maximum", "minimum")


@evaluates(*(op_type for op_type in _BINARY if op_type not in _KEEPS_FLOAT_TYPE))
def binary(op, x):
    a, b = x["x"], x["y"]
    if op.op_type == "pow":  # numpy's fp16 power converts each element: see binary_in_place
        a, b = _widened(a), _widened(b)
    return _BINARY[op.op_type](a, b)


@evaluates(*_KEEPS_FLOAT_TYPE, inplace=True)
def binary_in_place(op, x, donated=()):
    """Arithmetic that writes into a donated operand of the result's shape and float type, so
    a chain (conv -> mul -> add -> ...) reuses one buffer instead of allocating per op."""
    a, b = x["x"], x["y"]
    fn = _BINARY[op.op_type]
    result_type, shape = _broadcast(op, a, b)
    if result_type == np.float16:
        borrowed = kernels.half_binary(op.op_type, a, b)
        if borrowed is not None:
            return borrowed
        # numpy's fp16 loops convert each element to fp32 and back; widened whole, the result
        # rounded once to fp16 (the executor casts it) is the same, bit for bit, and faster
        a, b = _widened(a), _widened(b)
        donated = ("x" if a is not x["x"] else "", "y" if b is not x["y"] else "")
        result_type = np.result_type(a, b)
    for name, target in (("x", a), ("y", b)):
        if name in donated and target.dtype.kind == "f" and target.dtype == result_type and target.shape == shape:
            return fn(a, b, out=target)
    return fn(a, b)


def _broadcast(op, a, b) -> tuple[np.dtype, tuple]:
    """(result type, broadcast shape) of ``a`` and ``b``: kept on the op for arrays of the same
    shapes and types (numpy's broadcast_shapes cost a few percent of a conv net's run)."""
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
        return np.result_type(a, b), np.broadcast_shapes(np.shape(a), np.shape(b))
    return per_op(op, "_edgebuild_broadcast", (), (a.shape, a.dtype, b.shape, b.dtype),
                  lambda: (np.result_type(a, b), np.broadcast_shapes(a.shape, b.shape)))


def _widened(value):
    """An fp16 array as fp32 (a fresh array); anything else (a scalar, an fp32 operand) as it is."""
    return kernels.cast(value, np.float32) if isinstance(value, np.ndarray) and value.dtype == np.float16 else value


def _fits(target, a, b) -> bool:
    return (target.dtype.kind == "f" and target.dtype == np.result_type(a, b)
            and target.shape == np.broadcast_shapes(np.shape(a), np.shape(b)))


_UNARY = {
    "abs": np.abs,
    "acos": np.arccos,
    "asin": np.arcsin,
    "atan": np.arctan,
    "atanh": np.arctanh,
    "acosh": np.arccosh,
    "asinh": np.arcsinh,
    "ceil": np.ceil,
    "cos": np.cos,
    "cosh": np.cosh,
    "exp": np.exp,
    "exp2": np.exp2,
    "floor": np.floor,
    "logical_not": np.logical_not,
    "round": np.round,  # half to even: the doc's example rounds 0.5 to 0
    "sign": np.sign,
    "sin": np.sin,
    "sinh": np.sinh,
    "sqrt": np.sqrt,
    "square": np.square,
    "tan": np.tan,
    "tanh": np.tanh,
}


@evaluates(*_UNARY, inplace=True)
def unary(op, x, donated=()):
    value = x["x"]
    out = value if "x" in donated and value.dtype.kind == "f" and op.op_type != "logical_not" else None
    if value.dtype == np.float16 and op.op_type != "logical_not":
        # numpy's fp16 loops compute each element in fp32 and round it back: widened whole, the
        # result rounded once to fp16 (the executor casts it) is the same to the fp16 ulp, and faster
        value = out = kernels.cast(value, np.float32)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return _UNARY[op.op_type](value, out=out)


@evaluates("erf")
def erf(op, x):
    value = x["x"]
    value = kernels.cast(value, np.float32) if value.dtype == np.float16 else value
    borrowed = kernels.erf(value)
    return special.erf(value) if borrowed is None else borrowed


@evaluates("inverse")
def inverse(op, x):
    with np.errstate(divide="ignore"):
        return np.reciprocal(x["x"] + _epsilon(x, 1e-4))


@evaluates("log")
def log(op, x):
    # The default epsilon (1e-45) is an fp32 denormal; add it in fp32 so it is not lost.
    with np.errstate(divide="ignore", invalid="ignore"):
        epsilon = x.get("epsilon")
        epsilon = np.float32(1e-45 if epsilon is None else epsilon)
        return np.log(x["x"].astype(np.float32) + epsilon)


@evaluates("rsqrt")
def rsqrt(op, x):
    with np.errstate(divide="ignore", invalid="ignore"):
        return 1.0 / np.sqrt(x["x"] + _epsilon(x, 1e-12))


def _epsilon(x, default):
    epsilon = x.get("epsilon")
    return np.asarray(default if epsilon is None else epsilon).astype(x["x"].dtype)


@evaluates("clip", inplace=True)
def clip(op, x, donated=()):
    value = x["x"]
    out = value if "x" in donated and _fits(value, value, x["alpha"]) and _fits(value, value, x["beta"]) else None
    return np.minimum(np.maximum(value, x["alpha"], out=out), x["beta"], out=out)


@evaluates("threshold")
def threshold(op, x):
    return np.maximum(x["x"], x["alpha"])


@evaluates("cast")
def cast(op, x):
    from coremltools.converters.mil.mil import types

    target = np.dtype(types.string_to_nptype(str(x["dtype"])))
    value = np.asarray(x["x"])
    if np.issubdtype(target, np.integer) and np.issubdtype(value.dtype, np.floating):
        value = np.trunc(value)  # float -> int rounds toward zero
    return value.astype(target)
