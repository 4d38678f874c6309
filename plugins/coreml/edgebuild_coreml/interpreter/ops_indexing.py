"""MIL slicing, gather and scatter ops.

Negative indices wrap (iOS15/16 semantics; iOS17 calls them out of bounds, so wrapping is a
safe reading of programs from either). Scatter modes map to numpy's unbuffered ``ufunc.at``
so repeated indices accumulate.
"""

from __future__ import annotations

import numpy as np

from .registry import evaluates


def _flags(value, rank: int, default) -> list:
    return [default] * rank if value is None else list(np.atleast_1d(value))


def slice_key(x: dict, rank: int) -> tuple[tuple, tuple[int, ...]]:
    """numpy index for slice_by_index-style params, and the axes squeeze_mask removes."""
    begin = [int(v) for v in np.atleast_1d(x["begin"])]
    end = [int(v) for v in np.atleast_1d(x["end"])]
    stride = [int(v) for v in _flags(x.get("stride"), rank, 1)]
    begin_mask = _flags(x.get("begin_mask"), rank, False)
    end_mask = _flags(x.get("end_mask"), rank, False)
    squeeze_mask = _flags(x.get("squeeze_mask"), rank, False)
    key, squeezed = [], []
    for axis in range(rank):
        if squeeze_mask[axis]:
            # Keep the axis (length-1 slice) and drop it afterwards, so -1 works too.
            start = begin[axis]
            key.append(slice(start, start + 1 if start != -1 else None))
            squeezed.append(axis)
            continue
        key.append(
            slice(
                None if begin_mask[axis] else begin[axis],
                None if end_mask[axis] else end[axis],
                stride[axis],
            )
        )
    return tuple(key), tuple(squeezed)


@evaluates("slice_by_index")
def slice_by_index(op, x):
    value = np.asarray(x["x"])
    key, squeezed = slice_key(x, value.ndim)
    return np.squeeze(value[key], axis=squeezed) if squeezed else value[key]


@evaluates("slice_by_size")
def slice_by_size(op, x):
    value = np.asarray(x["x"])
    key = []
    for axis, (start, size) in enumerate(zip(np.atleast_1d(x["begin"]), np.atleast_1d(x["size"]))):
        start = int(start) % value.shape[axis] if value.shape[axis] else 0
        key.append(slice(start, None if int(size) == -1 else start + int(size)))
    return value[tuple(key)]


@evaluates("slice_update")
def slice_update(op, x):
    result = np.array(x["x"], copy=True)
    key, _ = slice_key(x, result.ndim)
    target_shape = result[key].shape
    result[key] = np.reshape(x["update"], target_shape)
    return result


@evaluates("gather")
def gather(op, x):
    value, indices = np.asarray(x["x"]), np.asarray(x["indices"]).astype(np.int64)
    axis = int(x.get("axis", 0)) % value.ndim
    batch_dims = int(x.get("batch_dims", 0))
    if batch_dims == 0:
        return np.take(value, indices, axis=axis)
    batch_shape = value.shape[:batch_dims]
    flat_x = value.reshape((-1,) + value.shape[batch_dims:])
    flat_i = indices.reshape((-1,) + indices.shape[batch_dims:])
    parts = [np.take(xb, ib, axis=axis - batch_dims) for xb, ib in zip(flat_x, flat_i)]
    return np.stack(parts).reshape(batch_shape + parts[0].shape)


@evaluates("gather_along_axis")
def gather_along_axis(op, x):
    value = np.asarray(x["x"])
    axis = int(x.get("axis", 0)) % value.ndim
    indices = np.asarray(x["indices"]).astype(np.int64)
    indices = np.where(indices < 0, indices + value.shape[axis], indices)
    return np.take_along_axis(value, indices, axis=axis)


def _nd_key(indices: np.ndarray, dims: tuple[int, ...]) -> tuple:
    """Index tuple for the leading ``indices.shape[-1]`` dims, negatives wrapped."""
    indices = indices.astype(np.int64)
    return tuple(
        np.where(indices[..., k] < 0, indices[..., k] + dims[k], indices[..., k])
        for k in range(indices.shape[-1])
    )


@evaluates("gather_nd")
def gather_nd(op, x):
    value, indices = np.asarray(x["x"]), np.asarray(x["indices"])
    batch_dims = int(x.get("batch_dims", 0))
    if batch_dims == 0:
        return value[_nd_key(indices, value.shape)]
    batch_shape = value.shape[:batch_dims]
    flat_x = value.reshape((-1,) + value.shape[batch_dims:])
    flat_i = indices.reshape((-1,) + indices.shape[batch_dims:])
    parts = [xb[_nd_key(ib, xb.shape)] for xb, ib in zip(flat_x, flat_i)]
    return np.stack(parts).reshape(batch_shape + parts[0].shape)


_SCATTER_UFUNCS = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "max": np.maximum,
    "min": np.minimum,
}


def _scatter_into(data: np.ndarray, key: tuple, updates: np.ndarray, mode: str) -> np.ndarray:
    result = np.array(data, copy=True)
    if mode == "update":
        result[key] = updates
    elif mode in _SCATTER_UFUNCS:
        if mode == "div" and np.issubdtype(result.dtype, np.integer):
            # Integer division in place would need a float buffer; compute and cast back.
            widened = result.astype(np.float64)
            np.divide.at(widened, key, updates)
            return np.trunc(widened).astype(result.dtype)
        _SCATTER_UFUNCS[mode].at(result, key, updates)
    else:
        raise ValueError(f"unknown scatter mode {mode!r}")
    return result


@evaluates("scatter")
def scatter(op, x):
    data = np.asarray(x["data"])
    axis = int(x.get("axis", 0)) % data.ndim
    indices = np.asarray(x["indices"]).astype(np.int64).reshape(-1)
    indices = np.where(indices < 0, indices + data.shape[axis], indices)
    key = (slice(None),) * axis + (indices,)
    return _scatter_into(data, key, np.asarray(x["updates"]), str(x.get("mode", "update")))


@evaluates("scatter_along_axis")
def scatter_along_axis(op, x):
    data, updates = np.asarray(x["data"]), np.asarray(x["updates"])
    axis = int(x.get("axis", 0)) % data.ndim
    indices = np.asarray(x["indices"]).astype(np.int64)
    indices = np.where(indices < 0, indices + data.shape[axis], indices)
    key = list(np.ogrid[tuple(slice(n) for n in indices.shape)])
    key[axis] = indices
    return _scatter_into(data, tuple(key), updates, str(x.get("mode", "add")))


@evaluates("scatter_nd")
def scatter_nd(op, x):
    data = np.asarray(x["data"])
    key = _nd_key(np.asarray(x["indices"]), data.shape)
    return _scatter_into(data, key, np.asarray(x["updates"]), str(x.get("mode", "add")))
