"""Indexing: Gather, GatherElements, GatherND, ScatterElements (and Scatter), ScatterND, OneHot, NonZero.

ONNX allows negative indices (counted from the end); they are wrapped explicitly so the
result never depends on how a Core ML runtime treats them.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil.var import Var

from edgebuild_coreml.lowering.ops._util import dim, dtype_of, is_static, normalize_axis, rank_of, shape_of
from edgebuild_coreml.lowering.registry import lowers

_SCATTER_MODES = {"none": "update", "add": "add", "mul": "mul", "max": "max", "min": "min"}


def _int32(x):
    return x if dtype_of(x) == "int32" else mb.cast(x=x, dtype="int32")


def wrap_negative(indices, size):
    """indices + size where indices < 0 (size: int or int32 scalar Var)."""
    if isinstance(indices, np.ndarray) and not isinstance(size, Var):
        return np.where(indices < 0, indices + size, indices).astype(np.int32)
    return mb.select(cond=mb.less(x=indices, y=np.int32(0)), a=mb.add(x=indices, y=size), b=indices)


@lowers("Gather")
def gather(ctx, node):
    axis = int(ctx.attr(node, "axis", 0))
    data_value, index_value = ctx.const_value(node.inputs[0]), ctx.const_value(node.inputs[1])
    if data_value is not None and index_value is not None and data_value.size <= 4096:
        return np.take(data_value, np.asarray(index_value).astype(np.int64), axis=axis)
    x, indices = ctx.input(node, 0), _int32(ctx.input(node, 1))
    axis = normalize_axis(ctx, node, axis, rank_of(x))
    indices = wrap_negative(indices, dim(x, axis))
    if dtype_of(x) == "bool":  # MIL's gather takes no bool data (causal masks in exported decoders)
        picked = mb.gather(x=mb.cast(x=x, dtype="int32"), indices=indices, axis=axis)
        return mb.cast(x=picked, dtype="bool", name=ctx.name(node))
    return mb.gather(x=x, indices=indices, axis=axis, name=ctx.name(node))


@lowers("GatherElements")
def gather_elements(ctx, node):
    x, indices = ctx.input(node, 0), _int32(ctx.input(node, 1))
    axis = normalize_axis(ctx, node, int(ctx.attr(node, "axis", 0)), rank_of(x))
    indices = wrap_negative(indices, dim(x, axis))
    # ONNX lets indices be smaller than the data off the gather axis; MIL wants equal dims.
    data_dims, index_dims = shape_of(x), shape_of(indices)
    if any(d != i for a, (d, i) in enumerate(zip(data_dims, index_dims)) if a != axis):
        if not all(is_static(i) for i in index_dims):
            ctx.fail(node, "indices smaller than the data need a static shape")
        end = [0 if a == axis else int(i) for a, i in enumerate(index_dims)]
        mask = [a == axis for a in range(len(index_dims))]
        x = mb.slice_by_index(x=x, begin=[0] * len(end), end=end, end_mask=mask, name=ctx.name(node, "window"))
    return mb.gather_along_axis(x=x, indices=indices, axis=axis, name=ctx.name(node))


def _wrap_nd(ctx, node, x, indices, batch_dims: int):
    """Wrap negative entries of GatherND/ScatterND index tuples (last axis of ``indices``)."""
    depth = shape_of(indices)[-1]
    if not is_static(depth):
        ctx.fail(node, "the last dim of indices must be static")
    dims = shape_of(x)[batch_dims:batch_dims + depth]
    if all(is_static(d) for d in dims):
        sizes = np.array(dims, np.int32)
    else:
        sizes = mb.slice_by_index(x=mb.shape(x=x), begin=[batch_dims], end=[batch_dims + depth])
    return wrap_negative(indices, sizes)


def _bool_safe(ctx, node, x, gather):
    """MIL's gathers take no bool data (masks do get gathered): gather an int32 copy, cast back."""
    if dtype_of(x) != "bool":
        return gather(x, ctx.name(node))
    picked = gather(mb.cast(x=x, dtype="int32"), ctx.name(node, "int32"))
    return mb.cast(x=picked, dtype="bool", name=ctx.name(node))


@lowers("GatherND")
def gather_nd(ctx, node):
    x, indices = ctx.input(node, 0), _int32(ctx.input(node, 1))
    batch_dims = int(ctx.attr(node, "batch_dims", 0))
    indices = _wrap_nd(ctx, node, x, indices, batch_dims)
    if batch_dims:
        ctx.require_target(node, "iOS16", "GatherND with batch_dims")
        return _bool_safe(ctx, node, x, lambda data, name: mb.gather_nd(
            x=data, indices=indices, batch_dims=batch_dims, name=name))
    return _bool_safe(ctx, node, x, lambda data, name: mb.gather_nd(x=data, indices=indices, name=name))


def _scatter_mode(ctx, node) -> str:
    reduction = ctx.attr(node, "reduction", "none")
    if reduction not in _SCATTER_MODES:
        ctx.fail(node, f"reduction {reduction!r} is not supported")
    return _SCATTER_MODES[reduction]


def _writes_nothing(index_dims) -> bool:
    """No updates to write (the indices of an empty window): MIL's scatters take no zero-size operand."""
    return any(is_static(d) and d == 0 for d in index_dims)


def _unchanged(ctx, node, data):
    return data if not isinstance(data, Var) else mb.identity(x=data, name=ctx.name(node))


@lowers("ScatterND")
def scatter_nd(ctx, node):
    data, indices, updates = ctx.input(node, 0), _int32(ctx.input(node, 1)), ctx.input(node, 2)
    if _writes_nothing(shape_of(indices)[:-1]):  # [*updates, depth]: a depth of 0 writes whole slices
        return _unchanged(ctx, node, data)
    indices = _wrap_nd(ctx, node, data, indices, 0)
    return mb.scatter_nd(data=data, indices=indices, updates=updates, mode=_scatter_mode(ctx, node), name=ctx.name(node))


@lowers("Scatter", since=9, until=10)  # the old name of ScatterElements (deprecated at opset 11)
@lowers("ScatterElements")
def scatter_elements(ctx, node):
    data, indices, updates = ctx.input(node, 0), _int32(ctx.input(node, 1)), ctx.input(node, 2)
    if _writes_nothing(shape_of(indices)):
        return _unchanged(ctx, node, data)
    axis = normalize_axis(ctx, node, int(ctx.attr(node, "axis", 0)), rank_of(data))
    indices = wrap_negative(indices, dim(data, axis))
    if tuple(shape_of(indices)) != tuple(shape_of(data)):
        # MIL's scatter_along_axis wants indices shaped like the data; address every
        # update by its full coordinate instead and use scatter_nd.
        return mb.scatter_nd(
            data=data, indices=_coordinates(ctx, node, indices, axis), updates=updates,
            mode=_scatter_mode(ctx, node), name=ctx.name(node),
        )
    return mb.scatter_along_axis(
        data=data, indices=indices, updates=updates, axis=axis, mode=_scatter_mode(ctx, node), name=ctx.name(node)
    )


def _coordinates(ctx, node, indices, axis: int):
    """[*S, rank] coordinates: each element's own position, with ``indices`` on ``axis``."""
    dims = shape_of(indices)
    if all(is_static(d) for d in dims):
        grid = np.indices(dims, dtype=np.int32)
        positions = [grid[a][..., None] for a in range(len(dims))]
    else:  # a count the data decides (a detector's rois per level): each axis's positions, broadcast over S
        zeros = mb.expand_dims(x=mb.mul(x=indices, y=np.int32(0)), axes=[-1])
        sizes = mb.shape(x=indices)
        positions = []
        for a in range(len(dims)):
            size = np.int32(dims[a]) if is_static(dims[a]) else mb.gather(x=sizes, indices=np.int32(a))
            steps = mb.range_1d(start=np.int32(0), end=size, step=np.int32(1))
            shape = np.ones(len(dims) + 1, np.int32)
            shape[a] = -1
            positions.append(mb.add(x=zeros, y=mb.reshape(x=steps, shape=shape)))
    parts = [mb.expand_dims(x=indices, axes=[-1]) if a == axis else positions[a] for a in range(len(dims))]
    return mb.concat(values=parts, axis=-1, name=ctx.name(node, "coords"))


@lowers("OneHot")
def one_hot(ctx, node):
    indices = ctx.input(node, 0)
    depth = ctx.const(node, 1, what="depth")
    values = ctx.const(node, 2, what="values (off, on)").reshape(-1)
    depth = int(np.asarray(depth).reshape(-1)[0])
    if dtype_of(indices) != "int32":  # ONNX accepts float indices; they truncate
        indices = mb.cast(x=indices, dtype="int32")
    indices = wrap_negative(indices, np.int32(depth))
    rank = rank_of(indices) + 1
    axis = normalize_axis(ctx, node, int(ctx.attr(node, "axis", -1)), rank)
    values = values.astype(np.int32) if values.dtype.kind in "iu" else values.astype(np.float32)
    return mb.one_hot(
        indices=indices, one_hot_vector_size=np.int32(depth), axis=axis,
        on_value=values[1], off_value=values[0], name=ctx.name(node),
    )


@lowers("NonZero")
def non_zero(ctx, node):
    x = ctx.input(node, 0)
    value = ctx.const_value(node.inputs[0])
    if value is not None:
        return np.array(np.nonzero(value), dtype=np.int64)
    found = mb.non_zero(x=x, name=ctx.name(node, "rows"))  # [N, rank]; ONNX wants [rank, N]
    return mb.transpose(x=found, perm=[1, 0], name=ctx.name(node))
