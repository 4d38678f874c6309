"""DepthToSpace, SpaceToDepth and Pad."""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._nn_util import as_float, is_float, rank_of, static_shape
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
    return _pad(ctx, node, *_pads_and_value_inputs(ctx, node), axes=None)


@lowers("Pad", since=18)
def pad_inputs_on_axes(ctx, node):
    """Pad-18 adds the optional ``axes`` input: the pads are for those axes alone."""
    return _pad(ctx, node, *_pads_and_value_inputs(ctx, node), axes=ctx.const(node, 3, optional=True, what="axes"))


def _pads_and_value_inputs(ctx, node):
    pads = [int(p) for p in ctx.int32(ctx.const(node, 1, what="pads"), node, "pads").reshape(-1)]
    value_array = ctx.const(node, 2, optional=True, what="constant_value")
    value = 0.0 if value_array is None or np.asarray(value_array).size == 0 else np.asarray(value_array).reshape(())
    return pads, value


def _begins_ends(ctx, node, rank, pads, axes_array):
    """(begins, ends) per axis of the input, from ONNX's pads on ``axes_array`` (None: every axis)."""
    axes = list(range(rank)) if axes_array is None else [int(a) % rank for a in np.asarray(axes_array).reshape(-1)]
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


def _pad(ctx, node, pads, value, axes):
    """Every ONNX mode and negative pads (crops)."""
    x = ctx.input(node, 0)
    x = as_float(x)
    rank = rank_of(x)
    mode = ctx.attr(node, "mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    begins, ends = _begins_ends(ctx, node, rank, pads, axes)
    shape = static_shape(x)

    if mode == "constant":
        if any(b < 0 or e < 0 for b, e in zip(begins, ends)):
            if shape is None:
                ctx.fail(node, "negative pads (crops) need static input shapes", "pin the input shapes in the recipe")
            x = mb.slice_by_index(x=x, begin=[max(-b, 0) for b in begins],
                                  end=[s - max(-e, 0) for s, e in zip(shape, ends)], name=ctx.name(node, "crop"))
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

    if mode not in ("reflect", "edge", "wrap"):
        ctx.fail(node, f"unknown Pad mode {mode!r}")
    if shape is None:
        ctx.fail(node, f"{mode} Pad needs static input shapes", "pin the input shapes in the recipe")
    touched = [a for a in range(rank) if begins[a] or ends[a]]
    if not touched:
        return mb.identity(x=x, name=ctx.name(node))
    native = {"reflect": "reflect", "edge": "replicate"}.get(mode)
    limit = {"reflect": 1, "replicate": 0}.get(native, 0)
    if native and is_float(x) and all(a >= rank - 2 for a in touched) and all(
        0 <= begins[a] <= shape[a] - limit and 0 <= ends[a] <= shape[a] - limit for a in touched
    ):
        flat = []
        for a in range(rank - 2, rank):
            flat += [begins[a], ends[a]]
        return mb.pad(x=x, pad=np.array(flat, np.int32), mode=native, name=ctx.name(node))
    # Anything else (wrap, other axes, large or negative pads) is an exact gather per axis.
    for k, axis in enumerate(touched):
        indices = _source_indices(mode, shape[axis], begins[axis], ends[axis])
        last = k == len(touched) - 1
        x = mb.gather(x=x, indices=indices, axis=axis, name=ctx.name(node) if last else ctx.name(node, f"axis{axis}"))
    return x
