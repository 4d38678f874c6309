"""The stablehlo suite's integer cases: shifts, arithmetic, bitwise ops, comparisons and conversions
over every integer width (int8..int64, uint8..uint64), with the values that exercise each: a type's
ends, 0 and ±1, shift amounts up to, at and past the width, and negative ones.

A backend that carries integers in 32 bits (Core ML) holds a case only when every input and output
value fits int32, so 64-bit and uint32 cases draw their values inside that range, and keep their
results there (sums of half-range values, products of 16-bit magnitudes, left shifts of small values
by amounts below 27). 64-bit cases are traced and run by JAX with x64 enabled.
"""

from __future__ import annotations

from typing import Callable, Iterator

import numpy as np

INTEGERS = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]
_INT32_MAX = (1 << 31) - 1
SHAPE = (4, 12)


def carried_range(dtype) -> tuple[int, int]:
    """The type's values that a 32-bit integer carrier holds (-2**31 stays out for int64: its negation
    and quotient by -1 leave int32)."""
    info = np.iinfo(dtype)
    return max(int(info.min), -_INT32_MAX), min(int(info.max), _INT32_MAX)


def _full(dtype, rng, *, low=None, high=None):
    """Values over [low, high] (default: the carried range) with its ends, 0 and ±1 among them."""
    carried_low, carried_high = carried_range(dtype)
    low = carried_low if low is None else max(low, carried_low)
    high = carried_high if high is None else min(high, carried_high)
    edges = [v for v in (low, high, 0, 1, -1, low + 1, high - 1) if low <= v <= high]
    drawn = rng.integers(low, high, int(np.prod(SHAPE)), endpoint=True, dtype=np.int64)
    drawn[:len(edges)] = edges
    return rng.permutation(drawn).reshape(SHAPE).astype(dtype)


def shift_amounts(dtype, rng, *, largest: int | None = None):
    """Amounts below the width (up to ``largest``), the width and past it, and the negative ones
    (for an unsigned type: its largest carried value), each at least once."""
    info = np.iinfo(dtype)
    width = info.bits
    top = width - 1 if largest is None else min(largest, width - 1)
    amounts = sorted({0, 1, 2, width // 2, top - 1, top} & set(range(top + 1)))
    amounts += [width, width + 1, 2 * width + 5]
    low, high = carried_range(dtype)
    amounts += [-1, -width, low] if info.kind == "i" else [high]
    values = np.resize(np.array(amounts, np.int64), int(np.prod(SHAPE)))
    return rng.permutation(values).reshape(SHAPE).astype(dtype)


def _nonzero(values):
    return np.where(values == 0, np.asarray(3, values.dtype), values)  # divisors


# kind -> (dtype, rng) -> values
KINDS: dict[str, Callable] = {
    "full": _full,
    "nonzero": lambda d, rng: _nonzero(_full(d, rng)),
    "nonnegative": lambda d, rng: _full(d, rng, low=0),
    "nonnegative_small": lambda d, rng: _full(d, rng, low=0, high=15),
    "half": lambda d, rng: _full(d, rng, low=-(1 << 30), high=(1 << 30) - 1),
    "upper_half": lambda d, rng: _full(d, rng, low=1 << 30),
    "product": lambda d, rng: _full(d, rng, low=-(1 << 15), high=1 << 15),
    "small": lambda d, rng: _full(d, rng, low=-15, high=15),
    "shift": shift_amounts,
    "shift_small": lambda d, rng: shift_amounts(d, rng, largest=26),
}


def is_64_bit(dtype) -> bool:
    return np.dtype(dtype).kind in "iu" and np.dtype(dtype).itemsize == 8


def needs_x64(fn, arrays) -> bool:
    """Whether JAX must trace and run ``fn`` with x64: 64-bit inputs, or a 64-bit result of 32-bit ones."""
    return getattr(fn, "traced_with_x64", False) or any(is_64_bit(a.dtype) for a in arrays)


def _traced_with_x64(fn):
    fn.traced_with_x64 = True
    return fn


def _name(dtype) -> str:
    return np.dtype(dtype).name


def _wide(dtype) -> bool:
    """Whether the type's results can leave int32 (32-bit unsigned, 64-bit): its operands are bounded."""
    return np.dtype(dtype).itemsize == 8 or dtype is np.uint32


def integer_variants() -> Iterator[tuple[str, str, Callable, list]]:
    """(primitive, variant, function, input specs) of the integer cases; specs' kinds are in KINDS."""
    from jax import lax

    for dtype in INTEGERS:
        name, wide = _name(dtype), _wide(dtype)
        unsigned = np.dtype(dtype).kind == "u"
        # a left shift of a wide type keeps its results carried: small values, amounts below 27
        left = ("small" if not unsigned else "nonnegative_small", "shift_small") if wide else ("full", "shift")
        yield "shift_left", name, lax.shift_left, [(SHAPE, dtype, left[0]), (SHAPE, dtype, left[1])]
        # a logical shift of a negative int64 is a uint64 pattern from 2**63 down: beyond what is carried
        logical = "nonnegative" if is_64_bit(dtype) else "full"
        yield "shift_right_logical", name, lax.shift_right_logical, [(SHAPE, dtype, logical), (SHAPE, dtype, "shift")]
        yield ("shift_right_arithmetic", name, lax.shift_right_arithmetic,
               [(SHAPE, dtype, "full"), (SHAPE, dtype, "shift")])
    for dtype in INTEGERS:
        if dtype is np.int32:
            continue  # the general cases cover int32
        name, wide = _name(dtype), _wide(dtype)
        unsigned = np.dtype(dtype).kind == "u"
        operand = "half" if wide else "full"
        yield "add", name, lax.add, [(SHAPE, dtype, operand), (SHAPE, dtype, operand)]
        # an unsigned difference stays carried when the minuend is the larger
        sub = [(SHAPE, dtype, "upper_half"), (SHAPE, dtype, "half")] if wide and unsigned else \
            [(SHAPE, dtype, operand), (SHAPE, dtype, operand)]
        yield "sub", name, lax.sub, sub
        product = "product" if wide else "full"
        yield "mul", name, lax.mul, [(SHAPE, dtype, product), (SHAPE, dtype, product)]
        yield "div", name, lax.div, [(SHAPE, dtype, "full"), (SHAPE, dtype, "nonzero")]
        yield "rem", name, lax.rem, [(SHAPE, dtype, "full"), (SHAPE, dtype, "nonzero")]
        for primitive, fn in (("max", lax.max), ("min", lax.min), ("bitwise_and", lax.bitwise_and),
                              ("bitwise_or", lax.bitwise_or), ("bitwise_xor", lax.bitwise_xor)):
            yield primitive, name, fn, [(SHAPE, dtype, "full"), (SHAPE, dtype, "full")]
        if not (wide and unsigned):  # ~x of a carried uint32 is from 2**31 up: never carried
            yield "bitwise_not", name, lax.bitwise_not, [(SHAPE, dtype, "full")]
        for primitive in ("eq", "ne", "lt", "le", "gt", "ge"):
            yield primitive, name, getattr(lax, primitive), [(SHAPE, dtype, "full"), (SHAPE, dtype, "full")]
    for source in INTEGERS:
        for target in INTEGERS:
            if source is target:
                continue
            # a negative value converted to a wide unsigned type is from 2**31 up: drawn non-negative
            kind = "nonnegative" if _wide(target) and np.dtype(target).kind == "u" else "full"
            fn = _traced_with_x64(lambda x, t=target: lax.convert_element_type(x, t)) if is_64_bit(target) else \
                (lambda x, t=target: lax.convert_element_type(x, t))
            yield "convert_element_type", f"{_name(source)}_to_{_name(target)}", fn, [(SHAPE, source, kind)]
