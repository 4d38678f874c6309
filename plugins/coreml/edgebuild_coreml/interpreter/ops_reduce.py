"""MIL reductions (reduce_*) and reduce_argmax/argmin.

Sums accumulate in at least fp32: fp16 inputs are widened first, so only the result is
rounded to fp16 (the executor casts it back to the output's declared dtype).
"""

from __future__ import annotations

import numpy as np

from edgebuild.reference.reductions import log_sum_exp

from .registry import evaluates


def _axes(x) -> tuple[int, ...] | None:
    axes = x.get("axes")
    return None if axes is None else tuple(int(a) for a in np.atleast_1d(axes))


def _widened(value: np.ndarray) -> np.ndarray:
    return value.astype(np.float32) if value.dtype == np.float16 else value


_REDUCTIONS = {
    "reduce_sum": lambda v, a, k: np.sum(v, axis=a, keepdims=k),
    "reduce_mean": lambda v, a, k: np.mean(v, axis=a, keepdims=k),
    "reduce_prod": lambda v, a, k: np.prod(v, axis=a, keepdims=k),
    "reduce_max": lambda v, a, k: np.max(v, axis=a, keepdims=k),
    "reduce_min": lambda v, a, k: np.min(v, axis=a, keepdims=k),
    "reduce_sum_square": lambda v, a, k: np.sum(np.square(v), axis=a, keepdims=k),
    "reduce_l1_norm": lambda v, a, k: np.sum(np.abs(v), axis=a, keepdims=k),
    "reduce_l2_norm": lambda v, a, k: np.sqrt(np.sum(np.square(v), axis=a, keepdims=k)),
    "reduce_log_sum": lambda v, a, k: np.log(np.sum(v, axis=a, keepdims=k)),
    "reduce_log_sum_exp": log_sum_exp,
}


@evaluates(*_REDUCTIONS)
def reduce(op, x):
    keep_dims = bool(x.get("keep_dims", False))
    value = _widened(np.asarray(x["x"]))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return _REDUCTIONS[op.op_type](value, _axes(x), keep_dims)


@evaluates("reduce_argmax", "reduce_argmin")
def reduce_arg(op, x):
    axis = int(x.get("axis", -1))
    keep_dims = bool(x.get("keep_dims", False))
    pick = np.argmax if op.op_type == "reduce_argmax" else np.argmin
    # numpy returns the first index among ties, the natural reading of "not guaranteed".
    return pick(x["x"], axis=axis, keepdims=keep_dims)
