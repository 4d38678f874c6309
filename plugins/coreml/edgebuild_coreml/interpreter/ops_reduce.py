"""MIL reductions (reduce_*) and reduce_argmax/argmin.

Sums accumulate in at least fp32: fp16 inputs are widened first, so only the result is
rounded to fp16 (the executor casts it back to the output's declared dtype).
"""

from __future__ import annotations

import numpy as np

from edgebuild.plugin.reference import reductions

from . import torch_kernels as kernels
from ._params import per_op
from .registry import evaluates


def _axes(axes) -> tuple[int, ...] | None:
    return None if axes is None else tuple(int(a) for a in np.atleast_1d(axes))


def _widened(value: np.ndarray) -> np.ndarray:
    return kernels.cast(value, np.float32) if value.dtype == np.float16 else value


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
    "reduce_log_sum_exp": reductions.log_sum_exp,
}


def _block_sum(op, value: np.ndarray, axes, keep_dims: bool) -> np.ndarray | None:
    """The sum of a C-contiguous float32 array over a run of adjacent axes (a global pool's, a
    height's), viewed as [outer, inner, rest] and summed over inner: one matrix-vector product
    when outer or rest is 1, else one add.reduce (np.sum and np.mean cost several times more per
    call on the small arrays of a conv net); None for other arrays and axes. The layout is worked
    out once per op and input shape."""
    if value.dtype != np.float32:
        return None
    if not value.flags.c_contiguous:
        return _channels_last_block_sum(op, value, axes, keep_dims)
    layout = per_op(op, "_edgebuild_block_sum", (axes, keep_dims), (value.shape,),
                    lambda: _block_layout(value.shape, _axes(axes), bool(keep_dims)))
    return None if layout is None else _summed(value, layout)


def _summed(value: np.ndarray, layout: tuple) -> np.ndarray:
    how, shape, ones, result_shape = layout
    if how == "rows":
        sums = value.reshape(shape) @ ones
    elif how == "columns":
        sums = ones @ value.reshape(shape)
    else:
        sums = np.add.reduce(value.reshape(shape), axis=1)
    return sums.reshape(result_shape)


def _channels_last_block_sum(op, value: np.ndarray, axes, keep_dims: bool) -> np.ndarray | None:
    """``_block_sum`` of a channels-last array (``torch_kernels.channels_last``) over all of its
    spatial axes (a global pool): the sum over the pixels of its ``[N, pixels, C]`` memory."""
    if not kernels.channels_last(value):
        return None
    layout = per_op(op, "_edgebuild_block_sum_channels_last", (axes, keep_dims), (value.shape,),
                    lambda: _channels_last_layout(value.shape, _axes(axes), bool(keep_dims)))
    return None if layout is None else _summed_channels_last(value, layout)


def _summed_channels_last(value: np.ndarray, layout: tuple) -> np.ndarray:
    pixels_last, inner, result_shape = layout
    return _summed(value.transpose(pixels_last), inner).reshape(result_shape)


def _channels_last_layout(shape: tuple, axes, keep_dims: bool) -> tuple | None:
    """(the transpose to ``[N, *spatial, C]``, its ``_block_layout``, the result's shape) for
    ``_channels_last_block_sum``, or None unless ``axes`` are the spatial ones."""
    ndim = len(shape)
    if axes is None or any(not -ndim <= a < ndim for a in axes) or sorted(a % ndim for a in axes) != list(range(2, ndim)):
        return None
    pixels_last = (0, *range(2, ndim), 1)
    inner = _block_layout(tuple(shape[a] for a in pixels_last), tuple(range(1, ndim - 1)), False)
    result_shape = shape[:2] + (1,) * (ndim - 2) * keep_dims
    return None if inner is None else (pixels_last, inner, result_shape)


def _block_layout(shape: tuple, axes, keep_dims: bool) -> tuple | None:
    """(how, the shape to view the input as, the vector of ones it multiplies, the result's
    shape) of ``_block_sum`` over ``axes`` of an array of ``shape``, or None."""
    ndim = len(shape)
    size = int(np.prod(shape, dtype=np.int64))
    if ndim == 0 or size == 0:
        return None
    axes = tuple(range(ndim)) if axes is None else axes
    if any(not -ndim <= a < ndim for a in axes):
        return None  # numpy names the bad axis
    reduced = sorted({a % ndim for a in axes})
    if not reduced or len(reduced) != len(axes) or reduced != list(range(reduced[0], reduced[-1] + 1)):
        return None
    start, stop = reduced[0], reduced[-1] + 1
    inner, rest = int(np.prod(shape[start:stop], dtype=np.int64)), int(np.prod(shape[stop:], dtype=np.int64))
    result_shape = shape[:start] + (1,) * len(reduced) * keep_dims + shape[stop:]
    ones = np.ones(inner, np.float32)
    if rest == 1:
        return "rows", (-1, inner), ones, result_shape
    if size == inner * rest:
        return "columns", (inner, rest), ones, result_shape
    return "blocks", (-1, inner, rest), None, result_shape


def _averaged(op, sums: np.ndarray, size: int) -> np.ndarray:
    """``sums`` (a fresh array) of a ``reduce_sum``, or divided in place into a ``reduce_mean``'s."""
    if op.op_type == "reduce_mean":
        sums /= np.float32(size // sums.size)  # elements summed per result
    return sums


@evaluates(*_REDUCTIONS)
def reduce(op, x):
    keep_dims = x.get("keep_dims", False)
    value = _widened(np.asarray(x["x"]))
    if op.op_type in ("reduce_sum", "reduce_mean"):
        sums = _block_sum(op, value, x.get("axes"), keep_dims)
        if sums is not None:
            return _averaged(op, sums, value.size)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return _REDUCTIONS[op.op_type](value, _axes(x.get("axes")), bool(keep_dims))


@evaluates("reduce_argmax", "reduce_argmin")
def reduce_arg(op, x):
    axis = int(x.get("axis", -1))
    keep_dims = bool(x.get("keep_dims", False))
    pick = np.argmax if op.op_type == "reduce_argmax" else np.argmin
    # numpy returns the first index among ties, the natural reading of "not guaranteed".
    return pick(x["x"], axis=axis, keepdims=keep_dims)


def _prepare(op, x):
    """``value -> reduce(op, {..x, "x": value})`` of a float32 ``reduce_sum``/``reduce_mean`` for
    inputs of ``x["x"]``'s shape, its block layouts (C order and channels last) worked out once
    (the compiled plan keeps it while the op's constants stay the same); None for other ops."""
    value = x["x"]
    if op.op_type not in ("reduce_sum", "reduce_mean") or getattr(value, "dtype", None) != np.float32:
        return None
    axes, keep_dims = _axes(x.get("axes")), bool(x.get("keep_dims", False))
    plain = _block_layout(value.shape, axes, keep_dims)
    if plain is None:
        return None
    laid_last = _channels_last_layout(value.shape, axes, keep_dims) if value.ndim >= 3 else None
    constants = {name: given for name, given in x.items() if name != "x"}  # not the sample's input

    def call(value):
        if value.flags.c_contiguous:
            sums = _summed(value, plain)
        elif laid_last is not None and kernels.channels_last(value):
            sums = _summed_channels_last(value, laid_last)
        else:
            return reduce(op, {**constants, "x": value})
        return _averaged(op, sums, value.size)

    return call


reduce.prepare = _prepare
