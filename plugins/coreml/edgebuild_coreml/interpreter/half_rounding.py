"""fp32 values rounded to fp16's grid without leaving fp32: the fp16 emulation's rounding.

numpy converts to and from fp16 one element at a time (about 10 ns each way); emulating an fp16
program rounds every op's output, so the guard's emulated runs spent most of their time there.
fp16's spacing at a value is a power of two that its fp32 exponent bits give directly (10
mantissa bits below the leading one; the smallest normal's spacing across the subnormals), so a
division by it is exact and rounding is ``rint`` of the quotient (to nearest, ties to even, as a
cast rounds) or its floor plus a draw (stochastic). Beyond fp16's largest finite value the result
is what a cast gives: infinity.
"""

from __future__ import annotations

import numpy as np

FP16_MAX = 65504.0  # fp16's largest finite value
_EXPONENT_BIAS, _SMALLEST_NORMAL_EXPONENT, _MANTISSA_BITS = 127, -14, 10


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
    """fp32 ``array`` rounded to nearest fp16 values (ties to even), as a new fp32 array: bit for
    bit what a cast to fp16 and back gives, NaN payloads aside."""
    array = np.asarray(array, np.float32)
    if array.ndim == 0:  # ufuncs of 0-d arrays give scalars, which ``out=`` cannot take
        return round_to_half(array.reshape(1)).reshape(())
    spacing = fp16_spacing(array)
    with np.errstate(invalid="ignore", over="ignore"):
        rounded = np.divide(array, spacing)  # exact: a power of two; in ``array``'s layout
        np.rint(rounded, out=rounded)
        rounded *= spacing
        return _as_cast_beyond_range(rounded, rounded)


def stochastic_round_to_half(array: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """fp32 ``array`` rounded to either neighbouring fp16 value, the nearer more often (its mean
    is the value), as a new fp32 array; inf, NaN and values beyond fp16's range as a cast rounds them."""
    array = np.asarray(array, np.float32)
    if array.ndim == 0:
        return stochastic_round_to_half(array.reshape(1), rng).reshape(())
    spacing = fp16_spacing(array)
    with np.errstate(invalid="ignore", over="ignore"):
        steps = np.divide(array, spacing)
        rounded = np.floor(steps)
        steps -= rounded  # the fraction of a step above the lower neighbour: the chance of the upper
        rounded += rng.random(rounded.shape, dtype=np.float32) < steps
        rounded *= spacing
        np.copysign(rounded, array, out=rounded)  # a value rounded to zero keeps its sign, as in a cast
        return _as_cast_beyond_range(rounded, array)


def _as_cast_beyond_range(rounded: np.ndarray, source: np.ndarray) -> np.ndarray:
    """``rounded`` where ``source`` is beyond fp16's finite range (or NaN) set as a cast sets it."""
    beyond = ~(np.abs(source) <= FP16_MAX)
    if beyond.any():
        rounded[beyond] = source[beyond].astype(np.float16)
    return rounded
