"""Small helpers the rules share for reading constants and shapes off matched values."""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

EDGEBUILD_DOMAIN = "edgebuild"


def const_array(value: ir.Value | None) -> np.ndarray | None:
    """The value's constant contents, or None if it is computed or a (overridable) graph input."""
    if value is None or value.const_value is None or value.is_graph_input():
        return None
    try:
        return value.const_value.numpy()
    except (FileNotFoundError, ValueError):
        return None


def scalar(value: ir.Value | None) -> float | None:
    """A one-element constant as a float (any shape: ``[]``, ``[1]``, ``[1, 1]``...)."""
    array = const_array(value)
    if array is None or array.size != 1:
        return None
    return float(array.reshape(()))


def is_scalar(value: ir.Value | None, expected: float, rel_tol: float = 1e-4) -> bool:
    got = scalar(value)
    return got is not None and math.isclose(got, expected, rel_tol=rel_tol, abs_tol=1e-7)


def rank(value: ir.Value | None) -> int | None:
    return None if value is None or value.shape is None else len(value.shape)


def static_dim(value: ir.Value | None, axis: int) -> int | None:
    if value is None or value.shape is None or not -len(value.shape) <= axis < len(value.shape):
        return None
    dim = value.shape[axis]
    return dim if isinstance(dim, int) else None


def int_attr(node: ir.Node, name: str, default: int) -> int:
    attr = node.attributes.get(name)
    return default if attr is None else attr.as_int()


def float_attr(node: ir.Node, name: str, default: float) -> float:
    attr = node.attributes.get(name)
    return default if attr is None else attr.as_float()


def fresh_name(hint: ir.Value, suffix: str) -> str:
    """A name for a new initializer, derived from a value name that is unique in the graph."""
    return f"{hint.name or 'fused'}__{suffix}"


def new_initializer(op, array: np.ndarray, hint: ir.Value, suffix: str) -> ir.Value:
    """Add a constant to the replacement, named after ``hint`` so names stay unique."""
    name = fresh_name(hint, suffix)
    return op.initializer(ir.tensor(np.ascontiguousarray(array), name=name), name=name)
