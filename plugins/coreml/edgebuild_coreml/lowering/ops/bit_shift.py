"""BitShift on int32 arithmetic (MIL has no bit operations).

Core ML holds every integer as int32, a uint32 as its bit pattern (values from 2**31 up are
negative). Shifts are products and floor divisions by powers of two, arranged so that no step
overflows int32:

- narrower types (8 and 16 bits): LEFT is ``x * 2**y`` wrapped into the type's width, RIGHT a
  floor division (an arithmetic shift, which is the logical one for the unsigned, non-negative
  values);
- 32-bit patterns, LEFT: the bits of x that stay below the sign bit, times 2**y, plus the sign
  bit when bit ``31 - y`` of x is set;
- uint32 RIGHT (logical): the value with its top bit cleared, divided, plus ``2**(31 - y)`` when
  that bit was set; int32 RIGHT is the floor division.

A shift that is negative or not below the width gives the full-width result: 0, or -1 for a
right shift of a negative signed value. 64-bit types are held in int32 too, so they shift as
their 32-bit counterparts (uint64 as uint32: exact for values below 2**32).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._int_width import WIDTHS, wrap
from edgebuild_coreml.lowering.ops._util import dtype_of, select
from edgebuild_coreml.lowering.registry import lowers

# 2**k as int32 for k in 0..30 (2**31 is no positive int32)
_POWERS_OF_TWO = np.array([1 << k for k in range(31)], dtype=np.int32)
_INT32_MIN = np.int32(-(1 << 31))


@lowers("BitShift", since=11)
def bit_shift(ctx, node):
    x, y = _operand(ctx, node, 0), _operand(ctx, node, 1)
    if dtype_of(x) != "int32" or dtype_of(y) != "int32":
        ctx.fail(node, "BitShift needs integer inputs")
    bits, signed = WIDTHS.get(node.inputs[0].dtype, (32, True))
    bits = min(bits, 32)
    direction = ctx.attr(node, "direction", "LEFT")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    if direction not in ("LEFT", "RIGHT"):
        ctx.fail(node, f"direction must be LEFT or RIGHT, not {direction!r}")
    out_of_range = mb.logical_or(x=mb.less(x=y, y=np.int32(0)), y=mb.greater_equal(x=y, y=np.int32(bits)))
    amount = mb.minimum(x=mb.maximum(x=y, y=np.int32(0)), y=np.int32(bits - 1))
    if direction == "LEFT":
        shifted = _left(x, amount) if bits == 32 else wrap(mb.mul(x=x, y=_power(amount)), bits, signed)
        return select(out_of_range, np.int32(0), shifted, name=ctx.name(node))
    if bits < 32:
        shifted = mb.floor_div(x=x, y=_power(amount))  # amount <= 15
    elif signed:
        shifted = _right_arithmetic(x, amount)
    else:
        shifted = _right_logical(x, amount)
    if not signed:
        return select(out_of_range, np.int32(0), shifted, name=ctx.name(node))
    sign_fill = select(mb.less(x=x, y=np.int32(0)), np.int32(-1), np.int32(0))
    return select(out_of_range, sign_fill, shifted, name=ctx.name(node))


def _operand(ctx, node, index):
    """An input; an integer constant as int32 (a uint32 as its bit pattern, as Core ML holds it, and
    a uint64 below 2**32 as that uint32)."""
    value = node.inputs[index]
    if ctx.has_input(node, index) and value.dtype in (ir.DataType.UINT32, ir.DataType.UINT64):
        found = ctx.get(value)
        if isinstance(found, np.ndarray) and (not found.size or int(found.max()) < 1 << 32):
            return found.astype(np.uint32).view(np.int32)
    found = ctx.input(node, index)  # other constants outside int32 are refused there
    if isinstance(found, np.ndarray) and found.dtype.kind in "iu":
        return found.astype(np.int32)
    return found


def _power(amount):
    """2**amount for amount in 0..30."""
    return mb.gather(x=_POWERS_OF_TWO, indices=amount, axis=0)


def _split_power(amount):
    """2**amount for amount in 0..31 as two int32 factors (2**31 is no int32)."""
    low = mb.minimum(x=amount, y=np.int32(30))
    return _power(low), _power(mb.sub(x=amount, y=low))


def _times_power(value, amount):
    first, second = _split_power(amount)
    return mb.mul(x=mb.mul(x=value, y=first), y=second)


def _over_power(value, amount):
    first, second = _split_power(amount)
    return mb.floor_div(x=mb.floor_div(x=value, y=first), y=second)  # floor divisions compose


def _left(x, amount):
    """The 32-bit pattern of x << amount (amount in 0..31) without overflowing int32."""
    a = mb.maximum(x=amount, y=np.int32(1))  # amount 0 is x itself (its divisor 2**31 is no int32)
    below = _power(mb.sub(x=np.int32(31), y=a))  # 2**(31 - a): the bits of x that stay below the sign bit
    kept = mb.mod(x=x, y=below)  # floor mod: non-negative, < 2**(31 - a)
    top = mb.mod(x=mb.floor_div(x=x, y=below), y=np.int32(2))  # bit 31 - a of x, which becomes the sign bit
    shifted = mb.add(x=_times_power(kept, a), y=mb.mul(x=top, y=_INT32_MIN))
    return _unless_zero(amount, x, shifted)


def _right_arithmetic(x, amount):
    """x >> amount with the sign copied in (amount in 0..31)."""
    shifted = mb.floor_div(x=x, y=_power(mb.minimum(x=amount, y=np.int32(30))))
    sign_fill = select(mb.less(x=x, y=np.int32(0)), np.int32(-1), np.int32(0))
    return select(mb.equal(x=amount, y=np.int32(31)), sign_fill, shifted)


def _right_logical(x, amount):
    """The uint32 pattern x >> amount with zeros shifted in (amount in 0..31)."""
    a = mb.maximum(x=amount, y=np.int32(1))
    top = mb.cast(x=mb.less(x=x, y=np.int32(0)), dtype="int32")  # bit 31
    cleared = mb.sub(x=x, y=mb.mul(x=top, y=_INT32_MIN))  # x without bit 31: x + 2**31 where it is set
    moved = mb.mul(x=top, y=_power(mb.sub(x=np.int32(31), y=a)))  # bit 31 at 31 - a
    shifted = mb.add(x=_over_power(cleared, a), y=moved)
    return _unless_zero(amount, x, shifted)


def _unless_zero(amount, x, shifted):
    return select(mb.equal(x=amount, y=np.int32(0)), x, shifted)

