"""A recipe input's ``shape`` in its JSON form (as stage parameters hold it).

It is either one entry per dim (an int, a name, ``{range: [lo, hi]}`` or ``{enumerated: [sizes]}``)
or ``{enumerated: [[...], [...]]}``: exactly these whole shapes. Code that only needs to know
which dims are fixed reads the per-dim view; code that needs the pairs of sizes reads
``whole_shapes``.
"""

from __future__ import annotations

from typing import Any, Mapping


def whole_shapes(shape: Any) -> list[list[int]] | None:
    """The shapes of a whole-shape enumeration, or None for a per-dim shape."""
    if isinstance(shape, Mapping) and "enumerated" in shape:
        return [[int(d) for d in one] for one in shape["enumerated"]]
    return None


def per_dim(shape: Any) -> list | None:
    """One entry per dim: a whole-shape enumeration becomes the size where every shape agrees and
    ``{"enumerated": sizes}`` (in the order first listed) where they differ."""
    shapes = whole_shapes(shape)
    if shapes is None:
        return None if shape is None else list(shape)
    columns = [list(dict.fromkeys(sizes)) for sizes in zip(*shapes)]
    return [sizes[0] if len(sizes) == 1 else {"enumerated": sizes} for sizes in columns]


def has_range(shape: Any) -> bool:
    return any(isinstance(d, Mapping) and "range" in d for d in per_dim(shape) or ())
