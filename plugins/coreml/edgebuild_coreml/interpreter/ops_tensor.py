"""MIL ops that make or rearrange values: fill, range, select, sort/topk, cumsum, one_hot,
band_part, non_zero, shape, and the iOS17 activation quantize/dequantize pair."""

from __future__ import annotations

import numpy as np

from .registry import evaluates


@evaluates("fill")
def fill(op, x):
    return np.full([int(d) for d in np.atleast_1d(x["shape"])], x.get("value", 0.0))


@evaluates("fill_like")
def fill_like(op, x):
    return np.full(np.shape(x["ref_tensor"]), x.get("value", 0.0))


@evaluates("range_1d")
def range_1d(op, x):
    return np.arange(x["start"], x["end"], x["step"])


@evaluates("shape")
def shape(op, x):
    return np.array(np.shape(x["x"]), dtype=np.int32)


@evaluates("select")
def select(op, x):
    return np.where(x["cond"], x["a"], x["b"])


def _sort_order(value: np.ndarray, axis: int, ascending: bool) -> np.ndarray:
    """Stable sort indices; among equal values the lower index comes first either way."""
    if ascending:
        return np.argsort(value, axis=axis, kind="stable")
    key = value.astype(np.float64) if value.dtype.kind in "biu" else value
    return np.argsort(-key, axis=axis, kind="stable")


@evaluates("argsort")
def argsort(op, x):
    value = np.asarray(x["x"])
    return _sort_order(value, int(x.get("axis", -1)), bool(x.get("ascending", False)))


@evaluates("topk")
def topk(op, x):
    value = np.asarray(x["x"])
    axis = int(x.get("axis", -1)) % value.ndim
    k = int(x.get("k", 1))
    k = value.shape[axis] if k == -1 else k
    order = _sort_order(value, axis, bool(x.get("ascending", False)))
    indices = np.take(order, np.arange(k), axis=axis)
    values = np.take_along_axis(value, indices, axis=axis)
    if not bool(x.get("return_indices", True)):
        return values
    return values, indices


@evaluates("cumsum")
def cumsum(op, x):
    value = np.asarray(x["x"])
    axis = int(x.get("axis", 0)) % value.ndim
    if bool(x.get("reverse", False)):
        value = np.flip(value, axis)
    wide = np.float32 if value.dtype == np.float16 else None
    total = np.cumsum(value, axis=axis, dtype=wide)
    if bool(x.get("exclusive", False)):
        total = total - value
    return np.flip(total, axis) if bool(x.get("reverse", False)) else total


@evaluates("one_hot")
def one_hot(op, x):
    indices = np.asarray(x["indices"]).astype(np.int64)
    depth = int(x["one_hot_vector_size"])
    axis = int(x.get("axis", -1))
    axis = axis % (indices.ndim + 1)
    positions_shape = [1] * (indices.ndim + 1)
    positions_shape[axis] = depth
    hot = np.expand_dims(indices, axis) == np.arange(depth).reshape(positions_shape)
    return np.where(hot, x.get("on_value", 1), x.get("off_value", 0))


@evaluates("non_zero")
def non_zero(op, x):
    return np.argwhere(np.asarray(x["x"])).astype(np.int32)


@evaluates("band_part")
def band_part(op, x):
    value = np.asarray(x["x"])
    lower, upper = int(x.get("lower", -1)), int(x.get("upper", -1))
    rows = np.arange(value.shape[-2])[:, None]
    cols = np.arange(value.shape[-1])[None, :]
    keep = ((lower < 0) | (rows - cols <= lower)) & ((upper < 0) | (cols - rows <= upper))
    return np.where(keep, value, np.zeros((), value.dtype))


def _per_axis(param, rank: int, axis) -> np.ndarray:
    """Broadcast a scalar or per-``axis`` vector parameter against a rank-``rank`` tensor."""
    param = np.asarray(param)
    if param.ndim == 0 or axis is None:
        return param
    shape = [1] * rank
    shape[int(axis) % rank] = param.size
    return param.reshape(shape)


@evaluates("dequantize")
def dequantize(op, x):
    data = np.asarray(x["input"])
    axis = x.get("axis")
    scale = _per_axis(x["scale"], data.ndim, axis)
    zero_point = _per_axis(x.get("zero_point", 0), data.ndim, axis)
    return scale * (data.astype(np.float32) - zero_point.astype(np.float32))


@evaluates("quantize")
def quantize(op, x):
    data = np.asarray(x["input"])
    axis = x.get("axis")
    scale = _per_axis(x["scale"], data.ndim, axis).astype(np.float32)
    zero_point = _per_axis(x.get("zero_point", 0), data.ndim, axis).astype(np.float32)
    target = np.dtype(str(x["output_dtype"]))
    info = np.iinfo(target)
    quantized = np.round(data.astype(np.float32) / scale) + zero_point
    return np.clip(quantized, info.min, info.max).astype(target)
