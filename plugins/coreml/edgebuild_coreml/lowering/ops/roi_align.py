"""RoiAlign as explicit bilinear taps: sample positions from the rois, one gather, a reduction.

Core ML's ``crop_resize`` takes one sample per output bin; ONNX averages (or maxes) a
``sampling_ratio`` x ``sampling_ratio`` grid per bin with onnxruntime's border rules (samples
beyond one pixel outside the map count as 0; coordinates clamp at the last pixel), and its
``max`` mode takes the largest weighted corner, not the largest interpolated value. So the
lowering computes, per roi, the sample coordinates along each axis, their low/high pixel and
weights, gathers the four corners of every sample from the [N*H*W, C] feature map and
reduces each bin. The roi count may be decided at run time (a two-stage detector's proposals):
every reshape keeps it as its one inferred dim. An adaptive grid (``sampling_ratio`` 0) needs
constant rois of one grid size.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._nn_util import as_float, float_np, is_symbolic, shape_of, static_shape
from edgebuild_coreml.lowering.registry import lowers


def _axis_taps(ctx, node, start, size, bins: int, grid: int, extent: int, tag: str, dtype):
    """Low/high pixel (int32) and low/high weights (float) of every sample along one axis: [R, bins*grid]."""
    steps = (np.arange(bins)[:, None] + (np.arange(grid)[None, :] + 0.5) / grid).reshape(1, -1).astype(dtype)
    bin_size = mb.real_div(x=size, y=dtype(bins))
    at = mb.add(x=start, y=mb.mul(x=bin_size, y=steps), name=ctx.name(node, f"{tag}_samples"))
    inside = mb.logical_and(x=mb.greater_equal(x=at, y=dtype(-1.0)), y=mb.less_equal(x=at, y=dtype(extent)))
    at = mb.maximum(x=at, y=dtype(0.0))
    low = mb.floor(x=at)
    edge = mb.greater_equal(x=low, y=dtype(extent - 1))
    low = mb.select(cond=edge, a=dtype(extent - 1), b=low)
    at = mb.select(cond=edge, a=low, b=at)
    high = mb.select(cond=edge, a=low, b=mb.add(x=low, y=dtype(1.0)))
    frac = mb.sub(x=at, y=low)
    keep = mb.cast(x=inside, dtype="fp32" if dtype == np.float32 else "fp16")
    w_high = mb.mul(x=frac, y=keep)
    w_low = mb.mul(x=mb.sub(x=dtype(1.0), y=frac), y=keep, name=ctx.name(node, f"{tag}_w_low"))
    return mb.cast(x=low, dtype="int32"), mb.cast(x=high, dtype="int32"), w_low, w_high


def _grid_sizes(ctx, node, sampling_ratio: int, scale: float, offset: float, half_pixel: bool,
                bins: tuple[int, int]) -> tuple[int, int]:
    """Samples per bin along (height, width): the sampling ratio, or for 0 each axis's adaptive
    ``ceil(roi size / bins)``, which must come out the same for every (constant) roi."""
    if sampling_ratio > 0:
        return sampling_ratio, sampling_ratio
    values = ctx.const_value(node.inputs[1])
    if values is None:
        ctx.fail(node, "sampling_ratio 0 picks each roi's sample grid from its size, which needs constant rois",
                 hint="set sampling_ratio to a positive value (2 is common) or make the rois constant")
    boxes = np.asarray(values, dtype=np.float64) * scale - offset
    sizes = [boxes[:, 3] - boxes[:, 1], boxes[:, 2] - boxes[:, 0]]
    if not half_pixel:
        sizes = [np.maximum(s, 1.0) for s in sizes]
    grids = []
    for axis_sizes, b, axis in zip(sizes, bins, ("height", "width")):
        found = sorted({int(np.ceil(s / b)) for s in axis_sizes})
        if len(found) != 1:
            ctx.fail(node, f"sampling_ratio 0 gives these rois different sample grids along {axis}: {found}",
                     hint="set sampling_ratio to a positive value")
        grids.append(max(found[0], 1))
    return grids[0], grids[1]


@lowers("RoiAlign", since=10)
def roi_align(ctx, node):
    x, rois = as_float(ctx.input(node, 0)), as_float(ctx.input(node, 1))
    batch_indices = ctx.input(node, 2)
    shape, roi_shape = static_shape(x), shape_of(rois)
    if shape is None or len(shape) != 4 or len(roi_shape) != 2 or is_symbolic(roi_shape[1]) or int(roi_shape[1]) != 4:
        ctx.fail(node, "X must be [N, C, H, W] with a static shape and rois [R, 4] (R may be decided at run time)",
                 hint="pin the input shapes in the recipe's source.inputs")
    batch, channels, height, width = shape
    out_h, out_w = int(ctx.attr(node, "output_height", 1)), int(ctx.attr(node, "output_width", 1))
    mode = ctx.attr(node, "mode", "avg")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    transform = ctx.attr(node, "coordinate_transformation_mode", "half_pixel" if ctx.opset >= 16 else "output_half_pixel")
    transform = transform.decode() if isinstance(transform, bytes) else transform
    if mode not in ("avg", "max") or transform not in ("half_pixel", "output_half_pixel"):
        ctx.fail(node, f"mode {mode!r} / coordinate_transformation_mode {transform!r} is not an ONNX RoiAlign choice")
    half_pixel = transform == "half_pixel"
    offset = 0.5 if half_pixel else 0.0
    scale = float(ctx.attr(node, "spatial_scale", 1.0))
    grid_h, grid_w = _grid_sizes(ctx, node, int(ctx.attr(node, "sampling_ratio", 0)), scale, offset, half_pixel,
                                 (out_h, out_w))
    dtype = float_np(x)
    taps_per_roi = out_h * grid_h * out_w * grid_w * 4

    corners = mb.sub(x=mb.mul(x=rois, y=dtype(scale)), y=dtype(offset), name=ctx.name(node, "corners"))
    x1, y1, x2, y2 = mb.split(x=corners, num_splits=4, axis=1, name=ctx.name(node, "edges"))  # each [R, 1]
    extent_w, extent_h = mb.sub(x=x2, y=x1), mb.sub(x=y2, y=y1)
    if not half_pixel:  # the legacy mode stretches malformed rois to 1x1
        extent_w, extent_h = mb.maximum(x=extent_w, y=dtype(1.0)), mb.maximum(x=extent_h, y=dtype(1.0))
    ys = _axis_taps(ctx, node, y1, extent_h, out_h, grid_h, height, "y", dtype)  # [R, out_h*grid_h]
    xs = _axis_taps(ctx, node, x1, extent_w, out_w, grid_w, width, "x", dtype)  # [R, out_w*grid_w]

    image_start = mb.mul(x=mb.cast(x=batch_indices, dtype="int32"), y=np.int32(height * width))
    image_start = mb.reshape(x=image_start, shape=np.array([-1, 1, 1], np.int32))
    positions, weights = [], []
    for y_index, y_weight in ((ys[0], ys[2]), (ys[1], ys[3])):
        row = mb.add(x=mb.mul(x=mb.expand_dims(x=y_index, axes=[2]), y=np.int32(width)), y=image_start)
        for x_index, x_weight in ((xs[0], xs[2]), (xs[1], xs[3])):
            positions.append(mb.add(x=row, y=mb.expand_dims(x=x_index, axes=[1])))  # [R, out_h*grid_h, out_w*grid_w]
            weights.append(mb.mul(x=mb.expand_dims(x=y_weight, axes=[2]), y=mb.expand_dims(x=x_weight, axes=[1])))
    # Flattened in (bin row, sample row, bin col, sample col, corner) order.
    position = mb.reshape(x=mb.stack(values=positions, axis=3), shape=np.array([-1, taps_per_roi], np.int32))
    weight = mb.reshape(x=mb.stack(values=weights, axis=3), shape=np.array([-1, taps_per_roi, 1], np.int32))

    pixels = mb.reshape(x=mb.transpose(x=x, perm=[0, 2, 3, 1]), shape=np.array([batch * height * width, channels], np.int32),
                        name=ctx.name(node, "pixels"))
    taps = mb.mul(x=mb.gather(x=pixels, indices=position, axis=0), y=weight, name=ctx.name(node, "taps"))  # [R, T, C]
    per_bin = mb.reshape(x=taps, shape=np.array([-1, grid_h, out_w, grid_w * 4, channels], np.int32))
    if mode == "avg":
        pooled = mb.reduce_sum(x=per_bin, axes=[1, 3], keep_dims=False)
        pooled = mb.mul(x=pooled, y=dtype(1.0 / (grid_h * grid_w)))
    else:
        pooled = mb.reduce_max(x=per_bin, axes=[1, 3], keep_dims=False)
    pooled = mb.reshape(x=pooled, shape=np.array([-1, out_h, out_w, channels], np.int32))
    return mb.transpose(x=pooled, perm=[0, 3, 1, 2], name=ctx.name(node))
