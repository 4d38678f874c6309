"""BitwiseAnd/Or/Xor/Not on int32 arithmetic (MIL has no bit operations).

Not is arithmetic: ``-x - 1`` for signed types, ``2**w - 1 - x`` for unsigned ones. The binary
ops split both operands into their w bits along a new last axis (``floor_div`` by 2**k, then
``mod 2``; floor division is an arithmetic shift, so negative values give their two's
complement bits), combine the bits with +, - and *, and sum them back with weights 2**k — the
top bit weighing -2**(w-1) for a signed type. Everything stays exact in int32. 64-bit types are
carried as int32 (values within int32), and sign extension commutes with bitwise operations,
so they compute as int32.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._int_operands import operand
from edgebuild_coreml.lowering.ops._int_width import WIDTHS
from edgebuild_coreml.lowering.ops._util import dtype_of
from edgebuild_coreml.lowering.registry import lowers


def _width(ctx, node) -> tuple[int, bool]:
    dtype = node.inputs[0].dtype
    if dtype not in WIDTHS:
        ctx.fail(node, f"{node.op_type} needs integer inputs, not {getattr(dtype, 'name', dtype)}")
    bits, signed = WIDTHS[dtype]
    return (32, True) if bits >= 32 else (bits, signed)


def _int_input(ctx, node, index):
    x = operand(ctx, node, index, patterns=True)  # bit operations act on a uint32's pattern
    if dtype_of(x) != "int32":
        ctx.fail(node, f"input {index} is {dtype_of(x)}, not an integer tensor")
    return x


def _bits(ctx, node, x, bits: int, tag: str):
    """The bits of ``x`` along a new last axis (bit k at index k), as 0/1 int32."""
    low = min(bits, 31)  # 2**31 is no int32: the top bit of a 32-bit value is its sign
    powers = np.array([1 << k for k in range(low)], np.int32)
    column = mb.expand_dims(x=x, axes=[-1], name=ctx.name(node, f"{tag}_column"))
    split = mb.mod(x=mb.floor_div(x=column, y=powers, name=ctx.name(node, f"{tag}_shifted")), y=np.int32(2),
                   name=ctx.name(node, f"{tag}_low_bits"))
    if bits < 32:
        return split
    sign = mb.cast(x=mb.less(x=column, y=np.int32(0), name=ctx.name(node, f"{tag}_negative")), dtype="int32",
                   name=ctx.name(node, f"{tag}_sign_bit"))
    return mb.concat(values=[split, sign], axis=-1, name=ctx.name(node, f"{tag}_bits"))


def _weights(bits: int, signed: bool) -> np.ndarray:
    weights = [1 << k for k in range(bits - 1)] + [-(1 << (bits - 1)) if signed else 1 << (bits - 1)]
    return np.array(weights, np.int64).astype(np.int32)  # -2**31 fits; +2**31 only for uint32, never reached


@lowers("BitwiseAnd", "BitwiseOr", "BitwiseXor", since=18)
def bitwise_binary(ctx, node):
    bits, signed = _width(ctx, node)
    a = _bits(ctx, node, _int_input(ctx, node, 0), bits, "a")
    b = _bits(ctx, node, _int_input(ctx, node, 1), bits, "b")
    both = mb.mul(x=a, y=b, name=ctx.name(node, "both"))
    if node.op_type == "BitwiseAnd":
        combined = both
    else:
        either = mb.add(x=a, y=b, name=ctx.name(node, "sum"))
        twice = both if node.op_type == "BitwiseOr" else mb.mul(x=both, y=np.int32(2), name=ctx.name(node, "twice"))
        combined = mb.sub(x=either, y=twice, name=ctx.name(node, "combined"))
    weighted = mb.mul(x=combined, y=_weights(bits, signed), name=ctx.name(node, "weighted"))
    return mb.reduce_sum(x=weighted, axes=[-1], keep_dims=False, name=ctx.name(node))


@lowers("BitwiseNot", since=18)
def bitwise_not(ctx, node):
    bits, signed = _width(ctx, node)
    x = _int_input(ctx, node, 0)
    if signed or bits >= 32:  # two's complement: ~x = -x - 1 (mod 2**32 for uint32)
        return mb.sub(x=np.int32(-1), y=x, name=ctx.name(node))
    return mb.sub(x=np.int32((1 << bits) - 1), y=x, name=ctx.name(node))
