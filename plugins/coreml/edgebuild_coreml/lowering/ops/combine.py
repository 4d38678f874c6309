"""Joining, splitting and repeating tensors: Concat, Split, Expand, Tile, ConstantOfShape, Range."""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil.var import Var

from edgebuild_coreml.lowering.ops._util import (
    dtype_of,
    empty_of,
    is_static,
    normalize_axis,
    numpy_dtype,
    rank_of,
    shape_of,
    to_var,
)
from edgebuild_coreml.lowering.registry import lowers

_FOLD_LIMIT = 4096  # fold shape-sized constants in numpy; leave big tensors to MIL


@lowers("Concat")
def concat(ctx, node):
    indices = [i for i in range(len(node.inputs)) if ctx.has_input(node, i)]
    constants = [ctx.const_value(node.inputs[i]) for i in indices]
    axis = int(ctx.attr(node, "axis"))
    if all(c is not None and c.size <= _FOLD_LIMIT for c in constants):
        return np.concatenate([np.asarray(c) for c in constants], axis=axis)
    values = [ctx.input(node, i) for i in indices]
    rank = rank_of(values[0])
    axis = normalize_axis(ctx, node, axis, rank)
    # ONNX allows empty operands along the axis; MIL does not need them.
    values = [v for v in values if shape_of(v)[axis] != 0] or values[:1]
    if len(values) == 1:
        return mb.identity(x=to_var(values[0]), name=ctx.name(node))
    return mb.concat(values=values, axis=axis, name=ctx.name(node))


@lowers("Split", until=12)
def split_sizes_attribute(ctx, node):
    return _split(ctx, node, ctx.attr(node, "split"))


@lowers("Split", since=13)
def split_sizes_input(ctx, node):
    return _split(ctx, node, ctx.const(node, 1, optional=True, what="split"))


def _split(ctx, node, sizes):
    x = ctx.input(node, 0)
    axis = normalize_axis(ctx, node, int(ctx.attr(node, "axis", 0)), rank_of(x))
    count = len(node.outputs)
    size = shape_of(x)[axis]
    if sizes is None and ctx.attr(node, "num_outputs") is not None and is_static(size):
        count = int(ctx.attr(node, "num_outputs"))
        chunk = -(-size // count)  # ceil: the last chunk may be smaller
        sizes = [min(chunk, size - i * chunk) for i in range(count)]
    if sizes is None:
        if is_static(size) and size % count:
            ctx.fail(node, f"cannot split a dim of {size} into {count} equal parts")
        parts = mb.split(x=x, num_splits=count, axis=axis, name=ctx.name(node))
    else:
        parts = mb.split(x=x, split_sizes=[int(s) for s in np.asarray(sizes).reshape(-1)], axis=axis, name=ctx.name(node))
    return tuple(parts) if isinstance(parts, (list, tuple)) else (parts,)


@lowers("Expand")
def expand(ctx, node):
    x = ctx.input(node, 0)
    requested = ctx.const_value(node.inputs[1])
    dims = shape_of(x)
    if requested is not None and all(is_static(d) for d in dims):
        target = np.broadcast_shapes(tuple(dims), tuple(int(v) for v in requested))
        empty = empty_of(target, x)  # a 0 in the shape: MIL's tile takes no repeat of 0
        if empty is not None:
            return empty
        padded = (1,) * (len(target) - len(dims)) + tuple(dims)
        if len(padded) != len(dims):
            x = mb.reshape(x=x, shape=np.array(padded, np.int32), name=ctx.name(node, "rank"))
        reps = [t // p if p else 1 for t, p in zip(target, padded)]
        if all(r == 1 for r in reps):
            return mb.identity(x=x, name=ctx.name(node))
        return mb.tile(x=x, reps=reps, name=ctx.name(node))
    # Otherwise broadcast against zeros of the requested shape (bidirectional, like ONNX).
    shape = ctx.input(node, 1)
    if dtype_of(shape) != "int32":
        shape = mb.cast(x=shape, dtype="int32")
    kind = dtype_of(x)
    if kind == "bool":
        falses = mb.cast(x=mb.fill(shape=shape, value=0.0), dtype="bool")
        return mb.logical_or(x=x, y=falses, name=ctx.name(node))
    zeros = mb.fill(shape=shape, value=numpy_dtype(kind)(0) if kind != "fp16" else np.float32(0))
    if dtype_of(zeros) != kind:
        zeros = mb.cast(x=zeros, dtype=kind)
    return mb.add(x=x, y=zeros, name=ctx.name(node))


@lowers("Tile", until=5)
def tile_tiles_and_axis(ctx, node):
    ctx.fail(node, "Tile before opset 6 (tiles/axis inputs) is not supported")


@lowers("Tile", since=6)
def tile(ctx, node):
    x, reps = ctx.input(node, 0), ctx.const_value(node.inputs[1])
    if reps is not None:
        empty = empty_of(tuple(d * int(r) for d, r in zip(shape_of(x), reps.reshape(-1))), x)  # a repeat of 0
        if empty is not None:
            return empty
    return mb.tile(x=x, reps=ctx.input(node, 1), name=ctx.name(node))


@lowers("ConstantOfShape")
def constant_of_shape(ctx, node):
    fill_value = ctx.attr(node, "value")
    fill_value = np.zeros(1, np.float32) if fill_value is None else np.asarray(fill_value).reshape(-1)
    requested = ctx.const_value(node.inputs[0])
    if requested is not None and int(np.prod(requested)) <= _FOLD_LIMIT:
        return np.full(tuple(int(v) for v in requested), fill_value[0], dtype=fill_value.dtype)
    target = mil_dtype_for(fill_value.dtype)
    shape = ctx.input(node, 0)
    if dtype_of(shape) != "int32":
        shape = mb.cast(x=shape, dtype="int32")
    value = fill_value.astype(np.float32)[0] if target in ("bool", "fp16") else fill_value.astype(numpy_dtype(target))[0]
    filled = mb.fill(shape=shape, value=value, name=ctx.name(node, "fill") if target in ("bool", "fp16") else ctx.name(node))
    return mb.cast(x=filled, dtype=target, name=ctx.name(node)) if target in ("bool", "fp16") else filled


def mil_dtype_for(np_dtype) -> str:
    if np_dtype == np.bool_:
        return "bool"
    if np.dtype(np_dtype).kind in "iu":
        return "int32"
    return "fp16" if np_dtype == np.float16 else "fp32"


@lowers("Range")
def range_(ctx, node):
    # Operands are scalars; single-element vectors (what Split of a shape leaves, as ONNX's own
    # function bodies such as AffineGrid's do) are read as scalars, as the ONNX reference does.
    values = [ctx.const_value(node.inputs[i]) for i in range(3)]
    if all(v is not None for v in values):
        start, limit, delta = (np.asarray(v).reshape(()) if np.size(v) == 1 else np.asarray(v) for v in values)
        count = max(int(np.ceil((limit - start) / delta)), 0)
        dtype = start.dtype
        return (start + np.arange(count, dtype=np.float64 if dtype.kind == "f" else np.int64) * delta).astype(dtype)
    operands = [ctx.input(node, i) for i in range(3)]
    start, limit, delta = (
        (mb.squeeze(x=v) if isinstance(v, Var) else np.asarray(v).reshape(()))
        if len(shape_of(v)) == 1 and shape_of(v)[0] == 1 else v
        for v in operands
    )
    return mb.range_1d(start=start, end=limit, step=delta, name=ctx.name(node))
