"""Elementwise and comparison ops, ``select``, ``clamp``, ``convert``, ``constant``,
``reduce_precision`` and the bitwise ops.

StableHLO's elementwise ops take operands of one shape (broadcasts are explicit), so each maps
to one ONNX op; integer and boolean forms pick the ONNX op of their kind.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from edgebuild_jax.convert.context import attribute
from edgebuild_jax.convert.registry import converts

UNARY = {
    "stablehlo.abs": "Abs", "stablehlo.negate": "Neg", "stablehlo.exponential": "Exp", "stablehlo.log": "Log",
    "stablehlo.sqrt": "Sqrt", "stablehlo.tanh": "Tanh", "stablehlo.sine": "Sin", "stablehlo.cosine": "Cos",
    "stablehlo.tan": "Tan", "stablehlo.floor": "Floor", "stablehlo.ceil": "Ceil", "stablehlo.sign": "Sign",
    "stablehlo.round_nearest_even": "Round", "stablehlo.logistic": "Sigmoid",
}
BINARY = {
    "stablehlo.add": "Add", "stablehlo.subtract": "Sub", "stablehlo.multiply": "Mul",
    "stablehlo.maximum": "Max", "stablehlo.minimum": "Min", "stablehlo.power": "Pow",
}
COMPARISONS = {"EQ": "Equal", "LT": "Less", "LE": "LessOrEqual", "GT": "Greater", "GE": "GreaterOrEqual"}
FLOATS = {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE}


def _unary(onnx_op):
    return lambda op, cx: [cx.node(onnx_op, cx.inputs(op))]


def _binary(onnx_op):
    return lambda op, cx: [cx.node(onnx_op, cx.inputs(op))]


for _name, _onnx in UNARY.items():
    converts(_name)(_unary(_onnx))
for _name, _onnx in BINARY.items():
    converts(_name)(_binary(_onnx))


@converts("stablehlo.constant")
def constant(op, cx):
    value = np.array(op.attributes["value"])
    dtype = cx.np_dtype(op.result)
    shape = cx.shape(op.result)
    if value.shape != tuple(shape):  # a splat is read as one element
        value = np.broadcast_to(value.reshape(-1)[:1] if value.size else value, shape)
    return [cx.const(np.array(value, dtype=dtype, order="C"), name="constant")]  # ascontiguousarray makes 0-d 1-d


@converts("stablehlo.divide")
def divide(op, cx):
    a, b = cx.inputs(op)
    if cx.dtype(op.result) in FLOATS:
        return [cx.node("Div", [a, b])]
    # StableHLO integer division truncates toward zero; ONNX Div on integers does too
    return [cx.node("Div", [a, b])]


@converts("stablehlo.remainder")
def remainder(op, cx):
    # the sign follows the dividend, as C's fmod: ONNX Mod with fmod=1
    return [cx.node("Mod", cx.inputs(op), {"fmod": 1})]


@converts("stablehlo.rsqrt")
def rsqrt(op, cx):
    return [cx.node("Reciprocal", [cx.node("Sqrt", cx.inputs(op))])]


@converts("stablehlo.exponential_minus_one")
def expm1(op, cx):
    (x,) = cx.inputs(op)
    one = cx.const(np.ones((), cx.np_dtype(op.result)))
    return [cx.node("Sub", [cx.node("Exp", [x]), one])]


@converts("stablehlo.log_plus_one")
def log1p(op, cx):
    (x,) = cx.inputs(op)
    one = cx.const(np.ones((), cx.np_dtype(op.result)))
    return [cx.node("Log", [cx.node("Add", [x, one])])]


@converts("stablehlo.cbrt")
def cbrt(op, cx):
    (x,) = cx.inputs(op)
    dtype = cx.np_dtype(op.result)
    third = cx.const(np.asarray(1.0 / 3.0, dtype))
    magnitude = cx.node("Pow", [cx.node("Abs", [x]), third])
    return [cx.node("Mul", [cx.node("Sign", [x]), magnitude])]


@converts("stablehlo.atan2")
def atan2(op, cx):
    y, x = cx.inputs(op)
    dtype = cx.np_dtype(op.result)
    zero, pi = cx.const(np.zeros((), dtype)), cx.const(np.asarray(np.pi, dtype))
    base = cx.node("Atan", [cx.node("Div", [y, x])])
    # x < 0: add pi with the sign of y (y == 0 counts as positive)
    y_negative = cx.node("Less", [y, zero])
    shift = cx.node("Where", [y_negative, cx.node("Neg", [pi]), pi])
    adjusted = cx.node("Add", [base, shift])
    return [cx.node("Where", [cx.node("Less", [x, zero]), adjusted, base])]


@converts("stablehlo.is_finite")
def is_finite(op, cx):
    (x,) = cx.inputs(op)
    return [cx.node("Not", [cx.node("Or", [cx.node("IsNaN", [x]), cx.node("IsInf", [x])])])]


@converts("stablehlo.and", "stablehlo.or", "stablehlo.xor")
def logical(op, cx):
    kind = op.operation.name.split(".")[1]
    if cx.dtype(op.result) == ir.DataType.BOOL:
        return [cx.node(kind.capitalize(), cx.inputs(op))]
    return [cx.node({"and": "BitwiseAnd", "or": "BitwiseOr", "xor": "BitwiseXor"}[kind], cx.inputs(op))]


@converts("stablehlo.not")
def logical_not(op, cx):
    if cx.dtype(op.result) == ir.DataType.BOOL:
        return [cx.node("Not", cx.inputs(op))]
    return [cx.node("BitwiseNot", cx.inputs(op))]


@converts("stablehlo.compare")
def compare(op, cx):
    a, b = cx.inputs(op)
    direction = str(op.attributes["comparison_direction"]).split()[-1].rstrip(">")
    if direction == "NE":
        return [cx.node("Not", [cx.node("Equal", [a, b])])]
    if direction not in COMPARISONS:
        raise cx.error(op, f"comparison direction {direction} is not supported")
    return [cx.node(COMPARISONS[direction], [a, b])]


@converts("stablehlo.select")
def select(op, cx):
    pred, on_true, on_false = cx.inputs(op)
    return [cx.node("Where", [pred, on_true, on_false])]


@converts("stablehlo.clamp")
def clamp(op, cx):
    low, x, high = cx.inputs(op)
    # bounds may be scalars or full tensors: Max/Min broadcast either way, where Clip needs scalars
    return [cx.node("Min", [cx.node("Max", [x, low]), high])]


@converts("stablehlo.convert")
def convert(op, cx):
    (x,) = cx.inputs(op)
    source, target = cx.dtype(op.operands[0]), cx.dtype(op.result)
    if source in FLOATS and target not in FLOATS and target != ir.DataType.BOOL:
        # float -> int truncates toward zero in StableHLO; ONNX Cast leaves it to the backend
        x = cx.node("Where", [cx.node("Less", [x, cx.const(np.zeros((), source.numpy()))]),
                              cx.node("Ceil", [x]), cx.node("Floor", [x])])
    return [cx.node("Cast", [x], {"to": target})]


@converts("stablehlo.reduce_precision")
def reduce_precision(op, cx):
    """Round to a narrower float format in place: exponent_bits/mantissa_bits of fp16 or bf16
    become a cast there and back; fp32's are the identity; other formats are refused."""
    (x,) = cx.inputs(op)
    exponent = int(attribute(op, "exponent_bits").value)
    mantissa = int(attribute(op, "mantissa_bits").value)
    narrow = {(5, 10): ir.DataType.FLOAT16, (8, 7): ir.DataType.BFLOAT16}.get((exponent, mantissa))
    source = cx.dtype(op.result)
    if (exponent, mantissa) in ((8, 23), (11, 52)) and source in (ir.DataType.FLOAT, ir.DataType.DOUBLE):
        width = {ir.DataType.FLOAT: (8, 23), ir.DataType.DOUBLE: (11, 52)}[source]
        if (exponent, mantissa) >= width:
            return [cx.node("Identity", [x])]
        narrow = ir.DataType.FLOAT
    if narrow is None:
        raise cx.error(op, f"rounding to {exponent} exponent and {mantissa} mantissa bits is not supported",
                       hint="only the fp16, bf16 and fp32 formats are")
    return [cx.node("Cast", [cx.node("Cast", [x], {"to": narrow})], {"to": source})]


@converts("stablehlo.shift_left", "stablehlo.shift_right_logical")
def shift(op, cx):
    a, b = cx.inputs(op)
    direction = "LEFT" if op.operation.name.endswith("left") else "RIGHT"
    if cx.dtype(op.result) not in (ir.DataType.UINT8, ir.DataType.UINT16, ir.DataType.UINT32, ir.DataType.UINT64):
        raise cx.error(op, "shifts of signed integers are not supported", hint="use an unsigned type")
    return [cx.node("BitShift", [a, b], {"direction": direction})]
