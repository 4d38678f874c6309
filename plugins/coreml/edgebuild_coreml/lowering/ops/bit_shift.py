"""BitShift on int32 arithmetic (MIL has no bit operations).

LEFT multiplies by 2**y and wraps into the ONNX type's width; RIGHT floor-divides by 2**y,
which is an arithmetic shift. A shift that is negative or not below the width gives the
full-width result, as ONNX defines: 0, or -1 for a right shift of a negative value.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._int_width import WIDTHS, wrap
from edgebuild_coreml.lowering.ops._util import dtype_of, select
from edgebuild_coreml.lowering.registry import lowers

# 2**i as int32 for i in 0..31; 2**31 wraps to -2**31, which still multiplies correctly mod 2**32.
_POWERS_OF_TWO = np.array([1 << i for i in range(31)] + [-(1 << 31)], dtype=np.int32)


@lowers("BitShift", since=11)
def bit_shift(ctx, node):
    x, y = ctx.input(node, 0), ctx.input(node, 1)
    if dtype_of(x) != "int32" or dtype_of(y) != "int32":
        ctx.fail(node, "BitShift needs integer inputs")
    width, signed = WIDTHS.get(node.inputs[0].dtype, (32, True))
    direction = ctx.attr(node, "direction", "LEFT")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    out_of_range = mb.logical_or(x=mb.less(x=y, y=np.int32(0)), y=mb.greater_equal(x=y, y=np.int32(width)))
    if direction == "LEFT":
        shift = mb.minimum(x=mb.maximum(x=y, y=np.int32(0)), y=np.int32(31))
        shifted = wrap(mb.mul(x=x, y=mb.gather(x=_POWERS_OF_TWO, indices=shift, axis=0)), width, signed)
        return select(out_of_range, np.int32(0), shifted, name=ctx.name(node))
    if direction != "RIGHT":
        ctx.fail(node, f"direction must be LEFT or RIGHT, not {direction!r}")
    shift = mb.minimum(x=mb.maximum(x=y, y=np.int32(0)), y=np.int32(30))  # 2**31 is not a positive int32
    shifted = mb.floor_div(x=x, y=mb.gather(x=_POWERS_OF_TWO, indices=shift, axis=0))
    sign_fill = select(mb.less(x=x, y=np.int32(0)), np.int32(-1), np.int32(0))
    saturated = mb.logical_or(x=out_of_range, y=mb.greater_equal(x=y, y=np.int32(31)))
    return select(saturated, sign_fill, shifted, name=ctx.name(node))
