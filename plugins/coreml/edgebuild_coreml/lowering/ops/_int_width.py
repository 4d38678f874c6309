"""ONNX integer types carried as int32: their widths, and wrapping a value back into one.

Core ML computes every integer in int32, so an ONNX int8 or uint4 result that overflows its
type must be reduced into it explicitly (two's complement, as ONNX's fixed-point casts and
shifts define).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from coremltools.converters.mil import Builder as mb

# ONNX integer type -> (bits, signed)
WIDTHS = {ir.DataType.INT2: (2, True), ir.DataType.UINT2: (2, False), ir.DataType.INT4: (4, True),
          ir.DataType.UINT4: (4, False), ir.DataType.INT8: (8, True), ir.DataType.UINT8: (8, False),
          ir.DataType.INT16: (16, True), ir.DataType.UINT16: (16, False), ir.DataType.INT32: (32, True),
          ir.DataType.UINT32: (32, False), ir.DataType.INT64: (64, True), ir.DataType.UINT64: (64, False)}


def value_range(bits: int, signed: bool) -> tuple[int, int]:
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


def fits(source: ir.DataType | None, target: ir.DataType) -> bool:
    """Whether every value of integer type ``source`` is a value of ``target`` (no wrap needed)."""
    if source == ir.DataType.BOOL:
        return True
    if source not in WIDTHS or target not in WIDTHS:
        return False
    low, high = value_range(*WIDTHS[source])
    target_low, target_high = value_range(*WIDTHS[target])
    return target_low <= low and high <= target_high


def wrap(value, bits: int, signed: bool, name: str | None = None):
    """``value`` (int32) reduced into a ``bits``-wide integer's range; 32 bits and more are
    left as they are (int32 arithmetic already wraps at 32 bits)."""
    kwargs = {"name": name} if name else {}
    if bits >= 32:
        return mb.identity(x=value, **kwargs) if name else value
    modulus = np.int32(1 << bits)
    if not signed:
        return mb.mod(x=value, y=modulus, **kwargs)
    half = np.int32(1 << (bits - 1))
    return mb.sub(x=mb.mod(x=mb.add(x=value, y=half), y=modulus), y=half, **kwargs)


def wrap_numpy(array: np.ndarray, bits: int, signed: bool) -> np.ndarray:
    """The same reduction on a constant (int64 arithmetic, int32 result when it fits)."""
    values = np.asarray(array).astype(np.int64)
    if bits < 64:
        modulus = 1 << bits
        values = np.mod(values + (modulus >> 1), modulus) - (modulus >> 1) if signed else np.mod(values, modulus)
    return values
