"""Bit-packing of palette indices for iOS16's ``constexpr_lut_to_dense`` (flat uint8 bytes).

Core ML reads the indices least significant bit first: element 0 fills the lowest bits of
byte 0, and an element may straddle two bytes when ``nbits`` does not divide 8.
"""

from __future__ import annotations

import numpy as np


def pack_indices(indices: np.ndarray, nbits: int) -> np.ndarray:
    """Pack unsigned ``indices`` (< 2**nbits) into ``ceil(size * nbits / 8)`` bytes."""
    flat = np.ascontiguousarray(indices, dtype=np.uint8).reshape(-1)
    if nbits == 8:
        return flat.copy()
    if 8 % nbits == 0:
        return _pack_dividing(flat, nbits)
    # 3 and 6 bits: spell out each element's bits, low first, then pack the bit stream.
    bits = np.unpackbits(flat[:, None], axis=1, bitorder="little")[:, :nbits]
    return np.packbits(bits.reshape(-1), bitorder="little")


def _pack_dividing(flat: np.ndarray, nbits: int) -> np.ndarray:
    """1, 2 and 4 bits: whole elements per byte, combined with shifts."""
    per_byte = 8 // nbits
    padded = np.zeros(-(-flat.size // per_byte) * per_byte, dtype=np.uint8)
    padded[: flat.size] = flat
    lanes = padded.reshape(-1, per_byte)
    packed = lanes[:, 0].copy()
    for lane in range(1, per_byte):
        packed |= lanes[:, lane] << np.uint8(lane * nbits)
    return packed
