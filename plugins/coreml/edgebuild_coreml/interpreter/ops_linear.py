"""Linear algebra evaluators (MIL ``linear.py``): ``linear``, ``matmul``, ``einsum``."""

from __future__ import annotations

import numpy as np

from . import torch_kernels as kernels
from ._params import as_float, param, scalar
from .registry import evaluates


def _keeps_ints(*arrays) -> bool:
    # by dtype kind: numpy's issubdtype cost a small linear layer as much as its product
    return all((a.dtype if isinstance(a, np.ndarray) else np.asarray(a).dtype).kind in "iu" for a in arrays)


def _operand(value, *others):
    return np.asarray(value) if _keeps_ints(value, *others) else as_float(value)


@evaluates("linear")
def linear(op, x):
    v, weight = _operand(x["x"], x["weight"]), _operand(x["weight"], x["x"])
    bias = x.get("bias")
    borrowed = kernels.linear(v, weight, bias)  # oneDNN's where torch's kernels are on
    if borrowed is not None:
        return borrowed
    out = np.matmul(v, weight.T if weight.ndim == 2 else np.swapaxes(weight, -1, -2))
    return out if bias is None else out + np.asarray(bias, dtype=out.dtype)


@evaluates("matmul")
def matmul(op, x):
    a, b = _operand(x["x"], x["y"]), _operand(x["y"], x["x"])
    if bool(scalar(param(op, x, "transpose_x", False))) and a.ndim >= 2:
        a = np.swapaxes(a, -1, -2)
    if bool(scalar(param(op, x, "transpose_y", False))) and b.ndim >= 2:
        b = np.swapaxes(b, -1, -2)
    # by a matrix (a weight): oneDNN's product where torch's kernels are on
    borrowed = kernels.linear(a, b.T, None) if b.ndim == 2 and a.ndim >= 2 else None
    return np.matmul(a, b) if borrowed is None else borrowed


@evaluates("einsum")
def einsum(op, x):
    values = [as_float(v) for v in x["values"]]
    return np.einsum(str(scalar(x["equation"])), *values, optimize=True)
