"""Shape and data-movement ops: reshape family, transpose, concat, slice, gather, expand, reductions."""

from __future__ import annotations

import numpy as np

from edgebuild.plugin import BuildError
from edgebuild_mpsgraph.lowering.registry import lowers


def _static(ctx, node, index: int, what: str) -> np.ndarray:
    value = ctx.const(node, index)
    if value is None:
        raise BuildError(f"node {node.name!r} ({node.op_type}): {what} must be known at build time for MPSGraph",
                         hint="pin the input shapes in the recipe so shape computations fold")
    return value


def _output_shape(node) -> list[int] | None:
    shape = node.outputs[0].shape
    return list(shape) if shape is not None and all(isinstance(d, int) for d in shape) else None


def _reshape_to(ctx, x, shape):
    shape = [int(d) for d in shape]
    return x if list(ctx.shape(x)) == shape else ctx.emit("reshape", [x], shape=shape)


@lowers("Reshape")
def lower_reshape(ctx, node):
    x = ctx.input(node, 0)
    target = [int(d) for d in _static(ctx, node, 1, "the target shape")]
    if not ctx.attr(node, "allowzero", 0):
        target = [ctx.shape(x)[i] if d == 0 else d for i, d in enumerate(target)]
    return _reshape_to(ctx, x, np.empty(ctx.shape(x), dtype=np.bool_).reshape(target).shape)


@lowers("Flatten")
def lower_flatten(ctx, node):
    x = ctx.input(node, 0)
    shape = ctx.shape(x)
    axis = ctx.attr(node, "axis", 1) % (len(shape) or 1) if shape else 0
    return _reshape_to(ctx, x, [int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))])


@lowers("Squeeze", until=12)
def lower_squeeze_axes_attribute(ctx, node):
    return _squeeze(ctx, node, ctx.attr(node, "axes", None))


@lowers("Squeeze", since=13)
def lower_squeeze_axes_input(ctx, node):
    return _squeeze(ctx, node, ctx.const(node, 1) if ctx.has_input(node, 1) else None)


def _squeeze(ctx, node, axes):
    x = ctx.input(node, 0)
    shape = list(ctx.shape(x))
    axes = [] if axes is None else sorted(int(a) % len(shape) for a in np.asarray(axes).ravel())
    axes = axes or [i for i, d in enumerate(shape) if d == 1]
    return _reshape_to(ctx, x, [d for i, d in enumerate(shape) if i not in axes])


@lowers("Unsqueeze", until=12)
def lower_unsqueeze_axes_attribute(ctx, node):
    return _unsqueeze(ctx, node, ctx.attr(node, "axes", None))


@lowers("Unsqueeze", since=13)
def lower_unsqueeze_axes_input(ctx, node):
    return _unsqueeze(ctx, node, _static(ctx, node, 1, "axes"))


def _unsqueeze(ctx, node, axes):
    x = ctx.input(node, 0)
    shape = list(ctx.shape(x))
    rank = len(shape) + int(np.size(axes))
    for axis in sorted(int(a) % rank for a in np.ravel(axes)):
        shape.insert(axis, 1)
    return _reshape_to(ctx, x, shape)


@lowers("Transpose")
def lower_transpose(ctx, node):
    x = ctx.input(node, 0)
    perm = ctx.attr(node, "perm", None) or list(reversed(range(len(ctx.shape(x)))))
    return ctx.emit("transpose", [x], permutation=[int(p) for p in perm])


@lowers("Concat")
def lower_concat(ctx, node):
    inputs = [ctx.input(node, i) for i in range(len(node.inputs))]
    rank = len(ctx.shape(inputs[0]))
    return ctx.emit("concatTensors", inputs, dimension=int(ctx.attr(node, "axis")) % rank)


@lowers("Slice", since=10)
def lower_slice(ctx, node):
    x = ctx.input(node, 0)
    shape = ctx.shape(x)
    starts = _static(ctx, node, 1, "starts")
    ends = _static(ctx, node, 2, "ends")
    axes = ctx.const(node, 3) if ctx.has_input(node, 3) else np.arange(len(starts))
    steps = ctx.const(node, 4) if ctx.has_input(node, 4) else np.ones(len(starts), dtype=np.int64)
    full_start, full_end, full_step = [0] * len(shape), list(shape), [1] * len(shape)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis = int(axis) % len(shape)
        # python slice semantics on one axis give the clamped range ONNX defines
        begin, stop, stride = slice(int(start), int(end), int(step)).indices(shape[axis])
        full_start[axis], full_end[axis], full_step[axis] = begin, stop, stride
    return ctx.emit("sliceTensor", [x], starts=full_start, ends=full_end, strides=full_step)


@lowers("Split", since=13)
def lower_split(ctx, node):
    x = ctx.input(node, 0)
    shape = ctx.shape(x)
    axis = int(ctx.attr(node, "axis", 0)) % len(shape)
    split = ctx.const(node, 1) if ctx.has_input(node, 1) else None
    count = len(node.outputs)
    sizes = [int(s) for s in split] if split is not None else [-(-shape[axis] // count)] * count
    outputs, begin = [], 0
    for size in sizes:
        starts, ends = [0] * len(shape), list(shape)
        starts[axis], ends[axis] = begin, min(begin + size, shape[axis])
        outputs.append(ctx.emit("sliceTensor", [x], starts=starts, ends=ends, strides=[1] * len(shape)))
        begin += size
    return outputs


@lowers("Gather")
def lower_gather(ctx, node):
    data = ctx.input(node, 0)
    axis = int(ctx.attr(node, "axis", 0)) % len(ctx.shape(data))
    indices = ctx.const(node, 1)
    if indices is not None:  # negative indices count from the end; MPSGraph's gather does not wrap
        index_tensor = ctx.constant(np.where(indices < 0, indices + ctx.shape(data)[axis], indices).astype(np.int32),
                                    "indices")
    else:
        index_tensor = ctx.input(node, 1)
    return ctx.emit("gatherWithUpdatesTensor", [data, index_tensor], axis=axis, batchDimensions=0)


@lowers("Expand")
def lower_expand(ctx, node):
    x = ctx.input(node, 0)
    target = np.broadcast_shapes(ctx.shape(x), tuple(int(d) for d in _static(ctx, node, 1, "the shape")))
    return ctx.emit("broadcast", [x], shape=list(target))


# Reductions take their axes as an attribute until ReduceSum-13 and the others' opset 18, as
# an optional input after: one lowering per side.
_REDUCTIONS = {"ReduceSum": "reductionSum", "ReduceMean": "mean", "ReduceMax": "reductionMaximum",
               "ReduceMin": "reductionMinimum"}
_REST = tuple(op_type for op_type in _REDUCTIONS if op_type != "ReduceSum")


@lowers("ReduceSum", until=12)
@lowers(*_REST, until=17)
def lower_reduce_axes_attribute(ctx, node):
    return _reduce(ctx, node, ctx.attr(node, "axes", None))


@lowers("ReduceSum", since=13)
@lowers(*_REST, since=18)
def lower_reduce_axes_input(ctx, node):
    return _reduce(ctx, node, ctx.const(node, 1) if ctx.has_input(node, 1) else None)


def _reduce(ctx, node, axes):
    x = ctx.input(node, 0)
    rank = len(ctx.shape(x))
    if axes is None or np.size(axes) == 0:
        if ctx.attr(node, "noop_with_empty_axes", 0):
            return x
        axes = list(range(rank))
    axes = sorted(int(a) % rank for a in np.ravel(axes))
    y = ctx.emit(_REDUCTIONS[node.op_type], [x], axes=axes)
    if not ctx.attr(node, "keepdims", 1):
        y = _reshape_to(ctx, y, [d for i, d in enumerate(ctx.shape(x)) if i not in axes])
    return y


@lowers("Shape", "Size", "ConstantOfShape", "Range")
def lower_static_only(ctx, node):
    """Folded at build time when their inputs are static; reaching this means they are not."""
    raise BuildError(f"node {node.name!r} ({node.op_type}) depends on a run-time shape; MPSGraph programs "
                     "here have static shapes", hint="pin every input dimension in the recipe's source.inputs")
