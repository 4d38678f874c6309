"""Quotient and remainder of uint32 values held as int32 bit patterns, without overflowing int32.

A pattern from 2**31 up is negative as an int32, so MIL's floor division of patterns is signed.
With u and v the unsigned values (v > 0):

- v from 2**31 up: the quotient is 1 where u >= v, else 0, and the remainder u - v or u;
- v below 2**31 and u below it too: the int32 floor division is the unsigned one;
- v below 2**31, u from 2**31 up: halve u (a logical shift by one, which fits int32), divide the
  half — q0 = h // v, r0 = h % v — then u = 2*q0*v + 2*r0 + b (b: u's low bit), and 2*r0 + b is
  below 2v: one more v where it reaches v. 2*q0 may pass 2**31, so it is written as its pattern.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import select

_HALF_RANGE = np.int32(1 << 30)
_INT32_MIN = np.int32(-(1 << 31))


def unsigned_divmod(x, y):
    """(quotient, remainder) of uint32 patterns ``x`` by ``y`` (y not 0)."""
    zero, one = np.int32(0), np.int32(1)
    x_high, y_high = mb.less(x=x, y=zero), mb.less(x=y, y=zero)
    # v from 2**31 up: at most one v fits in u (both negative patterns; x - y does not overflow)
    fits_once = mb.logical_and(x=x_high, y=mb.greater_equal(x=x, y=y))
    big_quotient = mb.cast(x=fits_once, dtype="int32")
    big_remainder = select(fits_once, mb.sub(x=x, y=y), x)
    # v below 2**31: u halved by a logical shift, as floor(x / 2) + 2**31 in two steps for a high u
    safe_y = select(y_high, one, y)  # the lanes with a high v take the branch above; keep their division defined
    floor_half = mb.floor_div(x=x, y=np.int32(2))
    half = select(x_high, mb.add(x=mb.add(x=floor_half, y=_HALF_RANGE), y=_HALF_RANGE), floor_half)
    q0, r0 = mb.floor_div(x=half, y=safe_y), mb.mod(x=half, y=safe_y)
    low_bit = mb.mod(x=x, y=np.int32(2))
    gap = mb.sub(x=mb.sub(x=safe_y, y=r0), y=low_bit)  # v - r0 - b: 2*r0 + b >= v where r0 >= it
    again = mb.greater_equal(x=r0, y=gap)
    doubled = select(mb.greater_equal(x=q0, y=_HALF_RANGE),
                     mb.add(x=mb.add(x=q0, y=_INT32_MIN), y=mb.add(x=q0, y=_INT32_MIN)),  # 2*q0 - 2**32
                     mb.add(x=q0, y=q0))
    high_quotient = mb.add(x=doubled, y=mb.cast(x=again, dtype="int32"))
    high_remainder = select(again, mb.sub(x=r0, y=gap), mb.add(x=mb.add(x=r0, y=r0), y=low_bit))
    # u below 2**31 as well: the signed division is the unsigned one
    low_quotient, low_remainder = mb.floor_div(x=x, y=safe_y), mb.mod(x=x, y=safe_y)
    quotient = select(y_high, big_quotient, select(x_high, high_quotient, low_quotient))
    remainder = select(y_high, big_remainder, select(x_high, high_remainder, low_remainder))
    return quotient, remainder
