"""Shape queries and reshaping: Shape, Size, Reshape, Flatten, Squeeze, Unsqueeze, Transpose.

Static shapes fold to numpy int64 constants, so the shape arithmetic that usually follows
(Gather, Concat, Reshape) folds too and the program keeps only the data path.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import (
    axes_attribute,
    axes_input,
    dim,
    dtype_of,
    is_static,
    normalize_axis,
    rank_of,
    shape_of,
    to_var,
)
from edgebuild_coreml.lowering.registry import lowers


def _clamped_range(start: int, end: int | None, rank: int) -> tuple[int, int]:
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = rank if end is None else end
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return start, end


@lowers("Shape")
def shape(ctx, node):
    x = ctx.input(node, 0)
    dims = shape_of(x)
    start, end = _clamped_range(int(ctx.attr(node, "start", 0)), ctx.attr(node, "end"), len(dims))
    if all(is_static(d) for d in dims[start:end]):
        return np.array(dims[start:end], dtype=np.int64)
    full = mb.shape(x=x, name=ctx.name(node, "full") if (start, end) != (0, len(dims)) else ctx.name(node))
    if (start, end) == (0, len(dims)):
        return full
    return mb.slice_by_index(x=full, begin=[start], end=[end], name=ctx.name(node))


@lowers("Size")
def size(ctx, node):
    x = ctx.input(node, 0)
    dims = shape_of(x)
    if all(is_static(d) for d in dims):
        return np.array(int(np.prod(dims, dtype=np.int64)), dtype=np.int64)
    return mb.reduce_prod(x=mb.shape(x=x), axes=[0], keep_dims=False, name=ctx.name(node))


def _target_shape(ctx, node, x, requested, allow_zero: bool):
    """ONNX Reshape's shape with 0 ('copy this dim') resolved; a Var when dims are symbolic."""
    dims = shape_of(x)
    resolved = []
    for i, size in enumerate(int(v) for v in requested):
        if size == 0 and not allow_zero:
            if i >= len(dims):
                ctx.fail(node, f"shape entry {i} is 0 (copy) but the input has rank {len(dims)}")
            resolved.append(dims[i])
        else:
            resolved.append(size)
    if all(is_static(d) for d in resolved):
        return np.array(resolved, dtype=np.int32)
    # A symbolic dim is copied: assemble the shape at run time.
    parts = [mb.expand_dims(x=dim(x, i), axes=[0]) if not is_static(d) else np.array([d], np.int32)
             for i, d in enumerate(resolved)]
    return mb.concat(values=parts, axis=0, name=ctx.name(node, "shape"))


def _runtime_target_shape(ctx, node, x, allow_zero: bool):
    """A runtime shape operand with ONNX's 0 = 'copy the input dim' applied explicitly
    (MIL's own 0 rule differs when the ranks differ)."""
    shape_var = ctx.input(node, 1)
    if dtype_of(shape_var) != "int32":
        shape_var = mb.cast(x=shape_var, dtype="int32")
    if allow_zero:
        # torch.export's views of dynamic dims (allowzero=1): the shape is taken as it is. A 0 at
        # run time would ask for an empty tensor, which Core ML cannot hold in any case.
        return shape_var
    length, rank = shape_of(shape_var)[0], rank_of(x)
    if not is_static(length):
        ctx.fail(node, "the shape operand needs a static length")
    input_dims = mb.shape(x=x)
    if length < rank:
        input_dims = mb.slice_by_size(x=input_dims, begin=[0], size=[length])
    elif length > rank:  # ONNX forbids a 0 past the input's rank; pad with 1s
        input_dims = mb.concat(values=[input_dims, np.ones(length - rank, np.int32)], axis=0)
    is_copy = mb.equal(x=shape_var, y=np.int32(0))
    return mb.select(cond=is_copy, a=input_dims, b=shape_var, name=ctx.name(node, "shape"))


@lowers("Reshape", until=4)
def reshape_shape_attribute(ctx, node):
    return _reshape(ctx, node, ctx.attr(node, "shape"))


@lowers("Reshape", since=5)
def reshape_shape_input(ctx, node):
    return _reshape(ctx, node, ctx.const_value(node.inputs[1]))


def _reshape(ctx, node, requested):
    """``requested``: the target shape when constant, else None (read at run time)."""
    x = ctx.input(node, 0)
    allow_zero = bool(ctx.attr(node, "allowzero", 0))
    if requested is None:
        return mb.reshape(x=x, shape=_runtime_target_shape(ctx, node, x, allow_zero), name=ctx.name(node))
    if allow_zero and 0 in list(requested) and -1 in list(requested):
        ctx.fail(node, "allowzero=1 with both 0 and -1 in the shape is invalid ONNX")
    if allow_zero and 0 in list(requested):
        ctx.fail(node, "allowzero=1 with a 0 in the shape makes an empty tensor, which Core ML cannot hold")
    return mb.reshape(x=x, shape=_target_shape(ctx, node, x, requested, allow_zero), name=ctx.name(node))


@lowers("Flatten")
def flatten(ctx, node):
    x = ctx.input(node, 0)
    rank = rank_of(x)
    axis = int(ctx.attr(node, "axis", 1))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis <= rank:
        ctx.fail(node, f"axis {axis} is out of range for a rank-{rank} input")
    dims = shape_of(x)
    outer, inner = dims[:axis], dims[axis:]
    if all(is_static(d) for d in outer):
        target = np.array([int(np.prod(outer, dtype=np.int64)), -1], dtype=np.int32)
    elif all(is_static(d) for d in inner):
        target = np.array([-1, int(np.prod(inner, dtype=np.int64))], dtype=np.int32)
    else:
        leading = mb.reduce_prod(x=mb.slice_by_index(x=mb.shape(x=x), begin=[0], end=[axis]), axes=[0], keep_dims=True)
        target = mb.concat(values=[leading, np.array([-1], np.int32)], axis=0)
    return mb.reshape(x=x, shape=target, name=ctx.name(node))


@lowers("Squeeze", "Unsqueeze", until=12)
def squeeze_or_unsqueeze_axes_attribute(ctx, node):
    return _BY_AXES[node.op_type](ctx, node, axes_attribute(ctx, node))


@lowers("Squeeze", "Unsqueeze", since=13)
def squeeze_or_unsqueeze_axes_input(ctx, node):
    return _BY_AXES[node.op_type](ctx, node, axes_input(ctx, node))


def _squeeze(ctx, node, axes):
    x = ctx.input(node, 0)
    rank = rank_of(x)
    if axes is None:
        dims = shape_of(x)
        if not all(is_static(d) for d in dims):
            ctx.fail(node, "squeezing every size-1 dim needs a static shape", hint="pass axes or pin input shapes")
        axes = [i for i, d in enumerate(dims) if d == 1]
    else:
        axes = sorted({normalize_axis(ctx, node, a, rank) for a in axes})
    if not axes:
        return mb.identity(x=x, name=ctx.name(node))
    value = ctx.const_value(node.inputs[0])
    if value is not None and value.size <= 4096:
        return np.squeeze(value, axis=tuple(axes))
    if len(axes) == rank:  # MIL squeeze of every dim yields a scalar; match ONNX's rank 0
        return mb.squeeze(x=x, name=ctx.name(node))
    return mb.squeeze(x=x, axes=axes, name=ctx.name(node))


def _unsqueeze(ctx, node, axes):
    x = ctx.input(node, 0)
    if axes is None:
        ctx.fail(node, "axes are required")
    out_rank = rank_of(x) + len(axes)
    axes = sorted({normalize_axis(ctx, node, a, out_rank) for a in axes})
    value = ctx.const_value(node.inputs[0])
    if value is not None and value.size <= 4096:
        return np.expand_dims(value, axis=tuple(axes))
    return mb.expand_dims(x=to_var(x), axes=axes, name=ctx.name(node))


_BY_AXES = {"Squeeze": _squeeze, "Unsqueeze": _unsqueeze}


@lowers("Transpose")
def transpose(ctx, node):
    x = ctx.input(node, 0)
    rank = rank_of(x)
    perm = [int(p) for p in ctx.attr(node, "perm") or list(range(rank))[::-1]]
    if isinstance(x, np.ndarray):
        # A view, whatever its size: a weight read transposed (x @ W.T kept unfolded) gives its
        # reader W's own [out, in] memory back, which MIL ``linear`` wants, with no copy made.
        return x.transpose(perm)
    return mb.transpose(x=x, perm=perm, name=ctx.name(node))
