"""fp32 values rounded to fp16's grid without leaving fp32: the fp16 emulation's rounding.

numpy converts to and from fp16 one element at a time (about 10 ns each way); emulating an fp16
program rounds every op's output, so the guard's emulated runs spent most of their time there.
Where fp16 is normal, its grid is fp32's with the 13 lowest mantissa bits cleared, so rounding is
integer arithmetic on the bits: add just under half of those bits' range (plus the lowest kept
bit, for ties to even) or a random number below it (stochastic), then clear them; a carry moves
into the exponent as it should, and the sign bit is left alone. Below fp16's smallest normal the
spacing is fixed and the value is divided by it (a power of two: exact) and rounded there;
beyond fp16's largest finite value the result is what a cast gives: infinity.
"""

from __future__ import annotations

import numpy as np

FP16_MAX = 65504.0  # fp16's largest finite value
_EXPONENT_BIAS, _SMALLEST_NORMAL_EXPONENT, _MANTISSA_BITS = 127, -14, 10
_DROPPED = np.uint32((1 << 13) - 1)  # fp32's mantissa bits below fp16's ten
_KEPT = ~_DROPPED
_MAGNITUDE = np.uint32(0x7FFFFFFF)
_SMALLEST_NORMAL_BITS = np.uint32((_EXPONENT_BIAS + _SMALLEST_NORMAL_EXPONENT) << 23)  # 2**-14
_MAX_BITS = np.uint32(0x477FE000)  # FP16_MAX's


def fp16_spacing(values: np.ndarray) -> np.ndarray:
    """The distance between neighbouring fp16 values around each of ``values`` (fp32, any
    layout), as fp32 powers of two: the spacing below the next power of two up."""
    exponent = np.ascontiguousarray(values).view(np.uint32) >> 23
    exponent &= 0xFF
    np.maximum(exponent, _EXPONENT_BIAS + _SMALLEST_NORMAL_EXPONENT, out=exponent)
    exponent -= _MANTISSA_BITS
    exponent <<= 23
    return exponent.view(np.float32).reshape(np.shape(values))


def round_to_half(array: np.ndarray) -> np.ndarray:
    """fp32 ``array`` rounded to nearest fp16 values (ties to even), as a new fp32 array in
    ``array``'s layout: bit for bit what a cast to fp16 and back gives, NaN payloads aside."""
    array = np.asarray(array, np.float32)
    if array.ndim == 0:  # ufuncs of 0-d arrays give scalars, which ``out=`` cannot take
        return round_to_half(array.reshape(1)).reshape(())
    bits = array.view(np.uint32)
    rounded = bits >> 13
    rounded &= 1
    rounded += _DROPPED >> 1
    rounded += bits
    rounded &= _KEPT
    return _edges_as_a_cast(rounded.view(np.float32), array, _nearest_by_spacing)


def stochastic_round_to_half(array: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """fp32 ``array`` rounded to either neighbouring fp16 value, the nearer more often (its mean
    is the value), as a new fp32 array in ``array``'s layout; inf, NaN and values beyond fp16's
    range as a cast rounds them."""
    array = np.asarray(array, np.float32)
    if array.ndim == 0:
        return stochastic_round_to_half(array.reshape(1), rng).reshape(())
    draws = _random_bits(rng, array.size).reshape(array.shape)
    draws &= _DROPPED
    rounded = np.add(array.view(np.uint32), draws, out=np.empty_like(array, np.uint32))
    rounded &= _KEPT
    return _edges_as_a_cast(rounded.view(np.float32), array, lambda values: _stochastic_by_spacing(values, rng))


def _random_bits(rng: np.random.Generator, count: int) -> np.ndarray:
    """``count`` uniform uint32s from ``rng``'s stream (its raw 64-bit draws, halved)."""
    return rng.bit_generator.random_raw((count + 1) // 2).view(np.uint32)[:count]


def _edges_as_a_cast(rounded: np.ndarray, source: np.ndarray, by_spacing) -> np.ndarray:
    """``rounded`` (rounded on the bits) with ``source``'s fp16 subnormals rounded by
    ``by_spacing`` instead and its values beyond fp16's finite range (or NaN) as a cast sets them."""
    magnitude = source.view(np.uint32) & _MAGNITUDE
    beyond = magnitude > _MAX_BITS
    magnitude -= 1  # zero wraps round to the top: it rounds on the bits, to itself
    below_smallest = magnitude < _SMALLEST_NORMAL_BITS - 1
    if below_smallest.any():
        rounded[below_smallest] = by_spacing(source[below_smallest])
    if beyond.any():
        with np.errstate(over="ignore"):
            rounded[beyond] = source[beyond].astype(np.float16)
    return rounded


def _nearest_by_spacing(values: np.ndarray) -> np.ndarray:
    spacing = fp16_spacing(values)
    rounded = np.divide(values, spacing)  # exact: a power of two
    np.rint(rounded, out=rounded)
    rounded *= spacing
    return np.copysign(rounded, values, out=rounded)


def _stochastic_by_spacing(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    spacing = fp16_spacing(values)
    steps = np.divide(values, spacing)
    rounded = np.floor(steps)
    steps -= rounded  # the fraction of a step above the lower neighbour: the chance of the upper
    rounded += rng.random(rounded.shape, dtype=np.float32) < steps
    rounded *= spacing
    return np.copysign(rounded, values, out=rounded)  # a value rounded to zero keeps its sign, as in a cast
