"""Bit-packing of palette indices, as Core ML stores uint<n> tensors (flat uint8 bytes).

Core ML reads the indices least significant bit first: element 0 fills the lowest bits of
byte 0, and an element may straddle two bytes when ``nbits`` does not divide 8. Both
``constexpr_lut_to_dense`` forms use this layout: iOS16's explicit uint8 ``indices`` and the
weight file's storage of iOS18's uint<n> ``indices``.
"""

from __future__ import annotations

import numpy as np

# Elements per slice when labelling by table look-up: numpy widens 16-bit indices to intp
# before gathering, and slices of this size keep the widened copy in cache. A multiple of 8,
# so every slice starts on a byte boundary for any nbits.
_SLICE = 1 << 18
_LANE_WORD = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def packed_size(count: int, nbits: int) -> int:
    return -(-count * nbits // 8)


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
    """1, 2 and 4 bits: read each byte's elements as one little-endian word and fold it.

    In a word of ``per_byte`` elements, element j sits at bit 8j; shifting the word right by
    j * (8 - nbits) brings it to bit j * nbits, and the low byte of the OR of those shifts is
    the packed byte (elements are below 2**nbits, so no shift drags stray bits into it).
    """
    per_byte = 8 // nbits
    whole = flat.size - flat.size % per_byte
    words = flat[:whole].view(_LANE_WORD[per_byte])
    folded = words.copy()
    for lane in range(1, per_byte):
        folded |= words >> (lane * (8 - nbits))
    packed = folded.astype(np.uint8)
    if whole == flat.size:
        return packed
    tail = np.zeros(per_byte, dtype=np.uint8)
    tail[: flat.size - whole] = flat[whole:]
    return np.concatenate([packed, _pack_dividing(tail, nbits)])


def pack_looked_up(table: np.ndarray, keys: np.ndarray, nbits: int) -> np.ndarray:
    """``pack_indices(table[keys], nbits)`` without materialising all of ``table[keys]``.

    ``table`` maps every key (e.g. every float16 bit pattern) to its index; ``keys`` is flat.
    """
    out = np.empty(packed_size(keys.size, nbits), dtype=np.uint8)
    labels = np.empty(min(_SLICE, keys.size), dtype=np.uint8)
    step = _SLICE * nbits // 8
    for index, start in enumerate(range(0, keys.size, _SLICE)):
        part = keys[start : start + _SLICE]
        np.take(table, part, out=labels[: part.size])
        packed = pack_indices(labels[: part.size], nbits)
        out[index * step : index * step + packed.size] = packed
    return out
