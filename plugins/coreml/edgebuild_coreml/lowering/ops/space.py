"""DepthToSpace, SpaceToDepth and Pad."""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil.var import Var

from edgebuild_coreml.lowering.ops._nn_util import as_float, is_float, rank_of, static_shape
from edgebuild_coreml.lowering.ops._util import dim, dtype_of, is_static, shape_of
from edgebuild_coreml.lowering.registry import lowers


def _block_layout(ctx, node):
    """(input, block size, mode, static NCHW shape or None for DCR) of a Depth/SpaceToDepth node."""
    x = as_float(ctx.input(node, 0))
    block = int(ctx.attr(node, "blocksize"))
    mode = ctx.attr(node, "mode", "DCR")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode == "DCR":
        return x, block, mode, None
    shape = static_shape(x)
    if shape is None:
        ctx.fail(node, f"CRD {node.op_type} needs static input shapes", "pin the input shapes in the recipe")
    return x, block, mode, shape


@lowers("DepthToSpace")
def depth_to_space(ctx, node):
    """DCR (ONNX default) is MIL's depth_to_space; CRD is spelled out as reshape/transpose."""
    x, block, mode, shape = _block_layout(ctx, node)
    if mode == "DCR":
        return mb.depth_to_space(x=x, block_size=block, name=ctx.name(node))
    n, c, h, w = shape
    split = mb.reshape(x=x, shape=[n, c // (block * block), block, block, h, w], name=ctx.name(node, "split"))
    moved = mb.transpose(x=split, perm=[0, 1, 4, 2, 5, 3], name=ctx.name(node, "moved"))
    return mb.reshape(x=moved, shape=[n, c // (block * block), h * block, w * block], name=ctx.name(node))


@lowers("SpaceToDepth")
def space_to_depth(ctx, node):
    """DCR (the only layout before the ``mode`` attribute) is MIL's space_to_depth; CRD keeps
    each channel's block together and is spelled out as reshape/transpose."""
    x, block, mode, shape = _block_layout(ctx, node)
    if mode == "DCR":
        return mb.space_to_depth(x=x, block_size=block, name=ctx.name(node))
    n, c, h, w = shape
    split = mb.reshape(x=x, shape=[n, c, h // block, block, w // block, block], name=ctx.name(node, "split"))
    moved = mb.transpose(x=split, perm=[0, 1, 3, 5, 2, 4], name=ctx.name(node, "moved"))
    return mb.reshape(x=moved, shape=[n, c * block * block, h // block, w // block], name=ctx.name(node))


@lowers("Pad", until=10)
def pad_attributes(ctx, node):
    """``pads`` (``paddings`` in Pad-1) and ``value`` are attributes."""
    pads = [int(p) for p in ctx.attr(node, "pads", ctx.attr(node, "paddings", []))]
    return _pad(ctx, node, pads, float(ctx.attr(node, "value", 0.0)), axes=None)


@lowers("Pad", since=11, until=17)
def pad_inputs(ctx, node):
    if ctx.const_value(node.inputs[1]) is None:
        return _pad_runtime(ctx, node, axes=None)
    return _pad(ctx, node, *_pads_and_value_inputs(ctx, node), axes=None)


@lowers("Pad", since=18)
def pad_inputs_on_axes(ctx, node):
    """Pad-18 adds the optional ``axes`` input: the pads are for those axes alone."""
    axes = ctx.const(node, 3, optional=True, what="axes")
    if ctx.const_value(node.inputs[1]) is None:
        return _pad_runtime(ctx, node, axes=axes)
    return _pad(ctx, node, *_pads_and_value_inputs(ctx, node), axes=axes)


def _pads_and_value_inputs(ctx, node):
    pads = [int(p) for p in ctx.int32(ctx.const(node, 1, what="pads"), node, "pads").reshape(-1)]
    return pads, _constant_value(ctx, node)


def _constant_value(ctx, node):
    value_array = ctx.const(node, 2, optional=True, what="constant_value")
    return 0.0 if value_array is None or np.asarray(value_array).size == 0 else np.asarray(value_array).reshape(())


def _mode(ctx, node) -> str:
    mode = ctx.attr(node, "mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("constant", "reflect", "edge", "wrap"):
        ctx.fail(node, f"unknown Pad mode {mode!r}")
    return mode


def _axes_list(rank, axes_array) -> list[int]:
    return list(range(rank)) if axes_array is None else [int(a) % rank for a in np.asarray(axes_array).reshape(-1)]


def _begins_ends(ctx, node, rank, pads, axes_array):
    """(begins, ends) per axis of the input, from ONNX's pads on ``axes_array`` (None: every axis)."""
    axes = _axes_list(rank, axes_array)
    if len(pads) != 2 * len(axes):
        ctx.fail(node, f"{len(pads)} pads for {len(axes)} axes; expected two per axis")
    begins, ends = [0] * rank, [0] * rank
    for i, axis in enumerate(axes):
        begins[axis], ends[axis] = pads[i], pads[len(axes) + i]
    return begins, ends


def _source_indices(mode: str, size: int, begin: int, end: int) -> np.ndarray:
    """Input index each output position along one axis copies, for edge/reflect/wrap."""
    positions = np.arange(-begin, size + end)
    if mode == "edge":
        return np.clip(positions, 0, size - 1).astype(np.int32)
    if mode == "wrap":
        return np.mod(positions, size).astype(np.int32)
    period = 2 * (size - 1)  # reflect without repeating the border
    if period == 0:
        return np.zeros_like(positions, dtype=np.int32)
    folded = np.mod(positions, period)
    return np.where(folded < size, folded, period - folded).astype(np.int32)


def _runtime_source_indices(mode: str, size, begin, end, tag: str):
    """:func:`_source_indices` as MIL ops, for a size or pads known only at run time (int32 scalars)."""
    start = mb.mul(x=begin, y=np.int32(-1), name=tag + "_start") if isinstance(begin, Var) else np.int32(-begin)
    stop = mb.add(x=size, y=end, name=tag + "_stop")
    positions = mb.range_1d(start=start, end=stop, step=np.int32(1), name=tag + "_positions")
    last = mb.sub(x=size, y=np.int32(1), name=tag + "_last")
    if mode == "edge":
        return mb.maximum(x=mb.minimum(x=positions, y=last, name=tag + "_below"), y=np.int32(0), name=tag + "_indices")
    if mode == "wrap":
        return mb.mod(x=positions, y=size, name=tag + "_indices")
    # reflect: fold into [0, 2 * (size - 1)), then mirror the upper half; a size of 1 repeats its element
    period = mb.maximum(x=mb.mul(x=last, y=np.int32(2), name=tag + "_twice"), y=np.int32(1), name=tag + "_period")
    folded = mb.mod(x=positions, y=period, name=tag + "_folded")
    mirrored = mb.sub(x=period, y=folded, name=tag + "_mirrored")
    inside = mb.less(x=folded, y=size, name=tag + "_inside")
    return mb.select(cond=inside, a=folded, b=mirrored, name=tag + "_indices")


def _pad(ctx, node, pads, value, axes):
    """Every ONNX mode and negative pads (crops), with constant pads."""
    x = ctx.input(node, 0)
    x = as_float(x)
    rank = rank_of(x)
    mode = _mode(ctx, node)
    begins, ends = _begins_ends(ctx, node, rank, pads, axes)
    shape = static_shape(x)

    if mode == "constant":
        if any(b < 0 or e < 0 for b, e in zip(begins, ends)):
            crop_ends = [max(-e, 0) for e in ends]
            # a symbolic size: count the crop from the end (end_mask where nothing is cropped)
            end = [-c for c in crop_ends] if shape is None else [s - c for s, c in zip(shape, crop_ends)]
            x = mb.slice_by_index(x=x, begin=[max(-b, 0) for b in begins], end=end,
                                  end_mask=[c == 0 for c in crop_ends] if shape is None else None,
                                  name=ctx.name(node, "crop"))
        flat = []
        for b, e in zip(begins, ends):
            flat += [max(b, 0), max(e, 0)]
        if not any(flat):
            return mb.identity(x=x, name=ctx.name(node))
        if not is_float(x):
            ctx.fail(node, "constant Pad of an integer tensor is not supported by Core ML's pad",
                     "cast the tensor to float around the Pad")
        fill = np.asarray(value, dtype=np.float16 if str(x.dtype).endswith("fp16") else np.float32)
        return mb.pad(x=x, pad=np.array(flat, np.int32), mode="constant", constant_val=fill, name=ctx.name(node))

    touched = [a for a in range(rank) if begins[a] or ends[a]]
    if not touched:
        return mb.identity(x=x, name=ctx.name(node))
    sizes = shape_of(x)
    static = all(is_static(sizes[a]) for a in touched)
    native = {"reflect": "reflect", "edge": "replicate"}.get(mode)
    limit = {"reflect": 1, "replicate": 0}.get(native, 0)
    if static:
        fits = native and all(0 <= begins[a] <= sizes[a] - limit and 0 <= ends[a] <= sizes[a] - limit for a in touched)
    else:
        # A flexible size: MIL's reflect pad is ONNX's for every size ONNX accepts (pads below the size).
        fits = native == "reflect" and all(begins[a] >= 0 and ends[a] >= 0 for a in touched)
    if fits and is_float(x) and all(a >= rank - 2 for a in touched):
        flat = []
        for a in range(rank - 2, rank):
            flat += [begins[a], ends[a]]
        return mb.pad(x=x, pad=np.array(flat, np.int32), mode=native, name=ctx.name(node))
    # Anything else (wrap, other axes, large or negative pads) is an exact gather per axis.
    for k, axis in enumerate(touched):
        if is_static(sizes[axis]):
            indices = _source_indices(mode, int(sizes[axis]), begins[axis], ends[axis])
        else:
            indices = _runtime_source_indices(mode, dim(x, axis), begins[axis], np.int32(ends[axis]),
                                              ctx.name(node, f"axis{axis}"))
        last = k == len(touched) - 1
        x = mb.gather(x=x, indices=indices, axis=axis, name=ctx.name(node) if last else ctx.name(node, f"axis{axis}"))
    return x


def _pad_runtime(ctx, node, axes):
    """Pads known only at run time (computed from the input's shape, say).

    constant: crop what the negative pads remove, then MIL's pad with the positive ones (a runtime
    ``pad`` operand must cover every axis). edge/reflect/wrap: a gather per padded axis with
    indices computed at run time, exact for any pad size.
    """
    x = as_float(ctx.input(node, 0))
    rank = rank_of(x)
    mode = _mode(ctx, node)
    pad_axes = _axes_list(rank, axes)
    pads = ctx.input(node, 1)
    if dtype_of(pads) != "int32":
        pads = mb.cast(x=pads, dtype="int32", name=ctx.name(node, "pads_int32"))
    count = shape_of(pads)[0] if rank_of(pads) == 1 else None
    if count != 2 * len(pad_axes):
        ctx.fail(node, f"the pads input has shape {list(shape_of(pads))}; expected [{2 * len(pad_axes)}] "
                       f"(two per padded axis)")
    if len(set(pad_axes)) != len(pad_axes):
        ctx.fail(node, "the axes input repeats an axis")
    # per input axis: (begin, end) as int32 scalars; 0 for axes not padded
    begin_of, end_of = {}, {}
    for i, axis in enumerate(pad_axes):
        begin_of[axis] = mb.gather(x=pads, indices=np.int32(i), axis=0, name=ctx.name(node, f"begin{axis}"))
        end_of[axis] = mb.gather(x=pads, indices=np.int32(len(pad_axes) + i), axis=0, name=ctx.name(node, f"end{axis}"))

    if mode == "constant":
        if not is_float(x):
            ctx.fail(node, "constant Pad of an integer tensor is not supported by Core ML's pad",
                     "cast the tensor to float around the Pad")
        zero = np.zeros(1, np.int32)
        begins = [mb.expand_dims(x=begin_of[a], axes=[0]) if a in begin_of else zero for a in range(rank)]
        ends = [mb.expand_dims(x=end_of[a], axes=[0]) if a in end_of else zero for a in range(rank)]
        begin_vec = mb.concat(values=begins, axis=0, name=ctx.name(node, "begins"))
        end_vec = mb.concat(values=ends, axis=0, name=ctx.name(node, "ends"))
        crop_begin = mb.maximum(x=mb.mul(x=begin_vec, y=np.int32(-1)), y=np.int32(0), name=ctx.name(node, "crop_begin"))
        crop_end = mb.maximum(x=mb.mul(x=end_vec, y=np.int32(-1)), y=np.int32(0), name=ctx.name(node, "crop_end"))
        stop = mb.sub(x=mb.shape(x=x), y=crop_end, name=ctx.name(node, "crop_stop"))
        cropped = mb.slice_by_index(x=x, begin=crop_begin, end=stop, name=ctx.name(node, "crop"))
        grow = mb.stack(values=[mb.maximum(x=begin_vec, y=np.int32(0)), mb.maximum(x=end_vec, y=np.int32(0))],
                        axis=1, name=ctx.name(node, "grow"))  # [rank, 2]: MIL's (before, after) per axis
        flat = mb.reshape(x=grow, shape=[2 * rank], name=ctx.name(node, "pad_amounts"))
        fill = np.asarray(_constant_value(ctx, node), dtype=np.float16 if str(x.dtype).endswith("fp16") else np.float32)
        return mb.pad(x=cropped, pad=flat, mode="constant", constant_val=fill, name=ctx.name(node))

    for k, axis in enumerate(pad_axes):
        indices = _runtime_source_indices(mode, dim(x, axis), begin_of[axis], end_of[axis],
                                          ctx.name(node, f"axis{axis}"))
        last = k == len(pad_axes) - 1
        x = mb.gather(x=x, indices=indices, axis=axis, name=ctx.name(node) if last else ctx.name(node, f"axis{axis}"))
    return x
