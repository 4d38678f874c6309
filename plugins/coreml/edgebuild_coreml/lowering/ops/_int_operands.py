"""Integer operands of elementwise ops, whatever their ONNX width, as the int32 MIL computes in.

Core ML holds every integer tensor as int32 (a uint32 as its bit pattern), but a constant keeps
its numpy type, and MIL refuses ``int32 + uint8``. The elementwise lowerings read their operands
here instead: an integer constant becomes int32. Results of arithmetic that can leave a narrow
type's range (int8 ``127 + 1``) are wrapped back into it, as onnxruntime's kernels compute in the
type itself. Orderings of uint32 values compare bit patterns unsigned: a pattern from 2**31 up is
negative as an int32 but the larger value.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._int_width import WIDTHS, wrap
from edgebuild_coreml.lowering.ops._util import select

# types whose values Core ML holds as uint32 bit patterns (a uint64 below 2**32 as that uint32)
_PATTERNS = (ir.DataType.UINT32, ir.DataType.UINT64)


def operand(ctx, node, index: int, *, patterns: bool = False):
    """``node.inputs[index]`` with an integer constant as int32. ``patterns``: a uint32 (or uint64
    below 2**32) constant from 2**31 up is taken as its int32 bit pattern, where the op compares
    patterns unsigned; elsewhere it is refused as outside int32 (by ``ctx.input``)."""
    value = node.inputs[index] if index < len(node.inputs) else None
    if patterns and value is not None and value.dtype in _PATTERNS and ctx.has_input(node, index):
        found = ctx.get(value)
        if isinstance(found, np.ndarray) and (not found.size or (found.min() >= 0 and int(found.max()) < 1 << 32)):
            return found.astype(np.uint32).view(np.int32)
    found = ctx.input(node, index)
    if isinstance(found, np.ndarray) and found.dtype.kind in "iu" and found.dtype != np.int32:
        return found.astype(np.int32)  # 8- and 16-bit constants; wider ones were range-checked by ctx.input
    return found


def operands(ctx, node, *, patterns: bool = False) -> list:
    """Every present input, as :func:`operand`."""
    return [operand(ctx, node, i, patterns=patterns) for i in range(len(node.inputs)) if ctx.has_input(node, i)]


def narrow_width(dtype) -> tuple[int, bool] | None:
    """(bits, signed) of an integer type narrower than 32 bits, else None."""
    width = WIDTHS.get(dtype)
    return width if width is not None and width[0] < 32 else None


def within_width(ctx, node, build):
    """``build(name)`` (an int32 result) wrapped into the node's narrow integer output type, if it
    has one; the last op carries the node's name either way."""
    width = narrow_width(node.outputs[0].dtype) if node.outputs else None
    if width is None:
        return build(ctx.name(node))
    return wrap(build(ctx.name(node, "unwrapped")), *width, name=ctx.name(node))


def is_unsigned(dtype) -> bool:
    width = WIDTHS.get(dtype)
    return width is not None and not width[1]


def compares_patterns(node) -> bool:
    """Whether the node's operands are uint32 patterns, whose order is unsigned."""
    return any(value is not None and value.dtype in _PATTERNS for value in node.inputs)


def unsigned_order(op: str, x, y, **kwargs):
    """``less``/``less_equal``/``greater``/``greater_equal`` of uint32 patterns: where the top bits
    differ, the operand with it set (negative as int32) is the larger; elsewhere the int32 order holds."""
    signed = getattr(mb, op)(x=x, y=y)
    x_high, y_high = mb.less(x=x, y=np.int32(0)), mb.less(x=y, y=np.int32(0))
    larger_is_y = op in ("less", "less_equal")
    return select(mb.logical_xor(x=x_high, y=y_high), y_high if larger_is_y else x_high, signed, **kwargs)
