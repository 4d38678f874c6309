"""Elementwise and comparison ops, ``select``, ``clamp``, ``convert``, ``constant``,
``reduce_precision`` and the bitwise ops.

StableHLO's elementwise ops take operands of one shape (broadcasts are explicit), so each maps
to one ONNX op; integer and boolean forms pick the ONNX op of their kind.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import onnx_ir as ir

from edgebuild_jax.convert.context import attribute
from edgebuild_jax.convert.registry import converts
from edgebuild_jax.convert.types import is_carried, source_dtype

UNARY = {
    "stablehlo.abs": "Abs", "stablehlo.exponential": "Exp", "stablehlo.log": "Log",
    "stablehlo.sqrt": "Sqrt", "stablehlo.tanh": "Tanh", "stablehlo.sine": "Sin", "stablehlo.cosine": "Cos",
    "stablehlo.tan": "Tan", "stablehlo.floor": "Floor", "stablehlo.ceil": "Ceil", "stablehlo.sign": "Sign",
    "stablehlo.round_nearest_even": "Round", "stablehlo.logistic": "Sigmoid", "stablehlo.atan": "Atan",
    # chlo ops: jax usually wraps them in a composite whose decomposition is inlined instead,
    # but a module may carry them bare
    "chlo.erf": "Erf", "chlo.acos": "Acos", "chlo.asin": "Asin", "chlo.atan": "Atan", "chlo.tan": "Tan",
    "chlo.sinh": "Sinh", "chlo.cosh": "Cosh", "chlo.asinh": "Asinh", "chlo.acosh": "Acosh", "chlo.atanh": "Atanh",
}
BINARY = {
    "stablehlo.add": "Add", "stablehlo.subtract": "Sub", "stablehlo.multiply": "Mul",
    "stablehlo.power": "Pow",
}
COMPARISONS = {"EQ": "Equal", "LT": "Less", "LE": "LessOrEqual", "GT": "Greater", "GE": "GreaterOrEqual"}
UNSIGNED = {ir.DataType.INT8: ir.DataType.UINT8, ir.DataType.INT16: ir.DataType.UINT16,
            ir.DataType.INT32: ir.DataType.UINT32, ir.DataType.INT64: ir.DataType.UINT64}
FLOATS = {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE}


def _unary(onnx_op):
    return lambda op, cx: [cx.node(onnx_op, cx.inputs(op))]


def _binary(onnx_op):
    return lambda op, cx: [cx.node(onnx_op, cx.inputs(op))]


for _name, _onnx in UNARY.items():
    converts(_name)(_unary(_onnx))
for _name, _onnx in BINARY.items():
    converts(_name)(_binary(_onnx))


# element types onnxruntime's Max and Min lack -> the type they run in
MINMAX_CARRIERS = {ir.DataType.INT16: ir.DataType.INT32, ir.DataType.UINT16: ir.DataType.INT32,
                   ir.DataType.BOOL: ir.DataType.INT32}


@converts("stablehlo.maximum", "stablehlo.minimum")
def maximum_minimum(op, cx):
    onnx_op = "Max" if op.operation.name.endswith("maximum") else "Min"
    return [carried(cx, onnx_op, cx.inputs(op), cx.dtype(op.result), MINMAX_CARRIERS)]


def carried(cx, onnx_op: str, inputs, dtype: ir.DataType, carriers: dict):
    """``onnx_op`` on ``inputs``, run in a wider type when ``carriers`` names one for ``dtype``."""
    carrier = carriers.get(dtype)
    if carrier is None:
        return cx.node(onnx_op, inputs)
    result = cx.node(onnx_op, [cx.node("Cast", [v], {"to": carrier}) for v in inputs])
    return cx.node("Cast", [result], {"to": dtype})


@converts("stablehlo.negate")
def negate(op, cx):
    (x,) = cx.inputs(op)
    dtype = cx.dtype(op.result)
    if dtype in UNSIGNED.values():  # ONNX Neg is for signed types; 0 - x wraps as StableHLO's does
        return [cx.node("Sub", [cx.const(np.zeros((), dtype.numpy())), x])]
    return [cx.node("Neg", [x])]


@converts("stablehlo.constant")
def constant(op, cx):
    dtype = cx.np_dtype(op.result)
    value = dense_values(op.attributes["value"], source_dtype(op.result.type)).astype(dtype)  # bf16 carried as f32
    shape = cx.shape(op.result)
    if value.size == int(np.prod(shape)):
        value = value.reshape(shape)
    else:  # a splat is read as one element
        value = np.broadcast_to(value.reshape(-1)[:1] if value.size else value, shape)
    return [cx.const(np.array(value, dtype=dtype, order="C"), name="constant")]  # ascontiguousarray makes 0-d 1-d


def dense_values(attr, dtype: np.dtype) -> np.ndarray:
    """A DenseElementsAttr as numpy. The buffer protocol lacks bf16, so such constants are read
    from the attribute's text (decimal numbers, hex bit patterns, or one hex blob of raw bytes)."""
    try:
        return np.array(attr)
    except (TypeError, ValueError, RuntimeError):
        if dtype != ml_dtypes.bfloat16:
            raise
    body = str(attr).split(":")[0].strip()
    body = body[len("dense<"):-1] if body.startswith("dense<") else body
    if body.startswith('"0x'):  # raw little-endian storage, the printer's form for large constants
        return np.frombuffer(bytes.fromhex(body.strip('"')[2:]), np.uint16).view(dtype)
    tokens = [t for t in re.split(r"[\[\],\s]+", body) if t]
    bits = [int(t, 16) if t.lower().startswith("0x") else None for t in tokens]  # NaN and inf print as bits
    floats = np.array([0.0 if b is not None else float(t) for t, b in zip(tokens, bits)], np.float32).astype(dtype)
    raw = floats.view(np.uint16)
    for index, b in enumerate(bits):
        if b is not None:
            raw[index] = b
    return raw.view(dtype)


@converts("stablehlo.divide")
def divide(op, cx):
    """Div. Integer division truncates toward zero, in StableHLO as in ONNX; what the spec leaves to
    the implementation is XLA's, as JAX computes it: x / 0 is -1 (all ones unsigned), and the
    signed minimum over -1 is the minimum."""
    a, b = cx.inputs(op)
    dtype = cx.dtype(op.result)
    if dtype in FLOATS:
        return [cx.node("Div", [a, b])]
    zero, safe, overflow = _integer_divisor(cx, a, b, dtype)
    quotient = cx.node("Div", [a, safe])
    if overflow is not None:
        quotient = where(cx, overflow, a, quotient, dtype)
    return [where(cx, zero, cx.const(np.asarray(-1).astype(dtype.numpy())), quotient, dtype)]


@converts("stablehlo.remainder")
def remainder(op, cx):
    """Mod with fmod=1: the sign follows the dividend, as C's fmod. For integers, XLA's x % 0 = x,
    and the signed minimum % -1 = 0."""
    a, b = cx.inputs(op)
    dtype = cx.dtype(op.result)
    if dtype in FLOATS:
        return [cx.node("Mod", [a, b], {"fmod": 1})]
    zero, safe, overflow = _integer_divisor(cx, a, b, dtype)
    rest = cx.node("Mod", [a, safe], {"fmod": 1})
    if overflow is not None:
        rest = where(cx, overflow, cx.const(np.zeros((), dtype.numpy())), rest, dtype)
    return [where(cx, zero, a, rest, dtype)]


def _integer_divisor(cx, a, b, dtype):
    """(b == 0, b with its zeros made ones, a == min and b == -1 for signed types else None): the
    cases the converters answer themselves, and a divisor that triggers neither."""
    numpy_type = dtype.numpy()
    zero = cx.node("Equal", [b, cx.const(np.zeros((), numpy_type))])
    safe = where(cx, zero, cx.const(np.ones((), numpy_type)), b, dtype)
    if np.iinfo(numpy_type).min == 0 or np.dtype(numpy_type).itemsize == 8:
        # unsigned: nothing overflows; 64-bit: backends carry it in int32, where its minimum is no value
        return zero, safe, None
    overflow = cx.node("And", [cx.node("Equal", [a, cx.const(np.asarray(np.iinfo(numpy_type).min, numpy_type))]),
                               cx.node("Equal", [safe, cx.const(np.asarray(-1, numpy_type))])])
    safe = where(cx, overflow, cx.const(np.ones((), numpy_type)), safe, dtype)
    return zero, safe, overflow


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


# element types onnxruntime's Where lacks -> the type the choice is made in (values convert exactly)
WHERE_CARRIERS = {
    ir.DataType.BOOL: ir.DataType.INT32, ir.DataType.INT16: ir.DataType.INT32, ir.DataType.UINT16: ir.DataType.INT32,
    ir.DataType.UINT64: ir.DataType.INT64, ir.DataType.BFLOAT16: ir.DataType.FLOAT,
}


@converts("stablehlo.select")
def select(op, cx):
    pred, on_true, on_false = cx.inputs(op)
    return [where(cx, pred, on_true, on_false, cx.dtype(op.result))]


def where(cx, pred, on_true, on_false, dtype: ir.DataType):
    """ONNX Where, through a wider carrier type for element types onnxruntime's Where lacks."""
    carrier = WHERE_CARRIERS.get(dtype)
    if carrier is None:
        return cx.node("Where", [pred, on_true, on_false])
    chosen = cx.node("Where", [pred, cx.node("Cast", [on_true], {"to": carrier}),
                               cx.node("Cast", [on_false], {"to": carrier})])
    return cx.node("Cast", [chosen], {"to": dtype})


@converts("stablehlo.clamp")
def clamp(op, cx):
    low, x, high = cx.inputs(op)
    # bounds may be scalars or full tensors: Max/Min broadcast either way, where Clip needs scalars
    dtype = cx.dtype(op.result)
    return [carried(cx, "Min", [carried(cx, "Max", [x, low], dtype, MINMAX_CARRIERS), high], dtype, MINMAX_CARRIERS)]


@converts("stablehlo.convert")
def convert(op, cx):
    """A Cast; float -> int truncates toward zero. A convert to bfloat16, carried as float32,
    rounds the value to bfloat16's 7 mantissa bits (nearest, ties to even) in float32."""
    (x,) = cx.inputs(op)
    source, target = cx.dtype(op.operands[0]), cx.dtype(op.result)
    if source in FLOATS and target not in FLOATS and target != ir.DataType.BOOL:
        # float -> int truncates toward zero in StableHLO; ONNX Cast leaves it to the backend
        x = cx.node("Where", [cx.node("Less", [x, cx.const(np.zeros((), source.numpy()))]),
                              cx.node("Ceil", [x]), cx.node("Floor", [x])])
    cast = cx.node("Cast", [x], {"to": target})
    if is_carried(op.result.type) and not is_carried(op.operands[0].type) and source != ir.DataType.BOOL:
        return [_round_mantissa(cx, cast, 7)]
    return [cast]


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
    if narrow == ir.DataType.BFLOAT16 and source == ir.DataType.FLOAT:
        return [_round_mantissa(cx, x, mantissa)]
    return [cx.node("Cast", [cx.node("Cast", [x], {"to": narrow})], {"to": source})]


def _round_mantissa(cx, x, mantissa: int):
    """fp32 rounded to nearest (ties to even) at ``mantissa`` bits of a format with fp32's exponent
    range (bfloat16), with fp32 arithmetic alone, since backends without bfloat16 drop a cast to it:
    Veltkamp's split (hi = c - (c - x), c = x * (2**s + 1)) for normal values, on x scaled down by a
    power of two where the product would overflow; below the smallest normal, the format's fixed
    spacing by adding and taking away a constant of that spacing's ulp. inf and NaN stay as they are."""
    split = 23 - mantissa
    factor = cx.const(np.asarray(2.0 ** split + 1.0, np.float32))

    def veltkamp(value):
        c = cx.node("Mul", [value, factor])
        return cx.node("Sub", [c, cx.node("Sub", [c, value])])

    magnitude = cx.node("Abs", [x])
    scale = 2.0 ** (split + 1)  # exact both ways: a power of two
    large = cx.node("Mul", [veltkamp(cx.node("Mul", [x, cx.const(np.asarray(1.0 / scale, np.float32))])),
                            cx.const(np.asarray(scale, np.float32))])
    spacing_ulp = cx.const(np.asarray(1.5 * 2.0 ** (-126 - mantissa + 23), np.float32))  # x + it has the spacing as ulp
    tiny = cx.node("Sub", [cx.node("Add", [x, spacing_ulp]), spacing_ulp])
    limit = cx.const(np.asarray(np.finfo(np.float32).max / scale, np.float32))
    normal = cx.const(np.asarray(np.finfo(np.float32).tiny, np.float32))
    finite = cx.const(np.asarray(np.finfo(np.float32).max, np.float32))
    rounded = cx.node("Where", [cx.node("Less", [magnitude, limit]),
                                cx.node("Where", [cx.node("Less", [magnitude, normal]), tiny, veltkamp(x)]), large])
    return cx.node("Where", [cx.node("LessOrEqual", [magnitude, finite]), rounded, x])


@converts("stablehlo.shift_left", "stablehlo.shift_right_logical", "stablehlo.shift_right_arithmetic")
def shift(op, cx):
    """Shifts on the unsigned type of the operand's width (signed values are reinterpreted by Cast,
    which wraps). An arithmetic right shift of a negative value is ~((~a) >> b). Shift amounts of
    the width or more (negative ones count as large) give 0, or -1 for a negative value shifted
    arithmetically, as StableHLO says, where ONNX leaves them undefined."""
    a, b = cx.inputs(op)
    kind = op.operation.name.split(".")[1]
    dtype = cx.dtype(op.result)
    if dtype == ir.DataType.BOOL or dtype in FLOATS:
        raise cx.error(op, f"{kind} of {dtype.name} values is not supported")
    unsigned = UNSIGNED.get(dtype, dtype)
    width = int(unsigned.itemsize * 8)
    ua, ub = (cx.node("Cast", [v], {"to": unsigned}) if unsigned != dtype else v for v in (a, b))
    too_far = cx.node("GreaterOrEqual", [ub, cx.const(np.asarray(width - 1 if kind.endswith("arithmetic") else width,
                                                                 unsigned.numpy()))])
    zero = cx.const(np.zeros((), unsigned.numpy()))
    if kind == "shift_left" or kind == "shift_right_logical":
        shifted = cx.node("BitShift", [ua, where(cx, too_far, zero, ub, unsigned)],
                          {"direction": "LEFT" if kind == "shift_left" else "RIGHT"})
        result = where(cx, too_far, zero, shifted, unsigned)
    else:
        # amounts past width - 1 fill with the sign bit, as a shift by width - 1 does
        amount = where(cx, too_far, cx.const(np.asarray(width - 1, unsigned.numpy())), ub, unsigned)
        # the sign bit set: negative for signed types, and for unsigned ones too, whose bits StableHLO
        # shifts the same way. A signed value is tested against 0; an unsigned one against 2**(w-1) up to
        # 32 bits, and as its int64 reinterpretation at 64 (2**63 is no value a 32-bit backend holds)
        if unsigned != dtype:
            negative = cx.node("Less", [a, cx.const(np.zeros((), dtype.numpy()))])
        elif width < 64:
            negative = cx.node("GreaterOrEqual", [ua, cx.const(np.asarray(1 << (width - 1), unsigned.numpy()))])
        else:
            as_signed = cx.node("Cast", [ua], {"to": ir.DataType.INT64})
            negative = cx.node("Less", [as_signed, cx.const(np.zeros((), np.int64))])
        positive_part = cx.node("BitShift", [ua, amount], {"direction": "RIGHT"})
        flipped = cx.node("BitShift", [cx.node("BitwiseNot", [ua]), amount], {"direction": "RIGHT"})
        result = where(cx, negative, cx.node("BitwiseNot", [flipped]), positive_part, unsigned)
    return [cx.node("Cast", [result], {"to": dtype}) if unsigned != dtype else result]


@converts("stablehlo.round_nearest_afz")
def round_away_from_zero(op, cx):
    """Halves round away from zero: sign(x) * (floor(|x|) + (fraction >= 0.5)); adding 0.5 before
    the floor would round 0.49999997 up in fp32."""
    (x,) = cx.inputs(op)
    dtype = cx.np_dtype(op.result)
    magnitude = cx.node("Abs", [x])
    whole = cx.node("Floor", [magnitude])
    up = cx.node("GreaterOrEqual", [cx.node("Sub", [magnitude, whole]), cx.const(np.asarray(0.5, dtype))])
    rounded = cx.node("Add", [whole, cx.node("Cast", [up], {"to": cx.dtype(op.result)})])
    return [cx.node("Mul", [cx.node("Sign", [x]), rounded])]
