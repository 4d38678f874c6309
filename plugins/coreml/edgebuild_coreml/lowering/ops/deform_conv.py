"""DeformConv (2-D): bilinear samples at offset kernel taps, then a 1x1 grouped conv.

Each kernel tap k of output pixel (i, j) reads the input at
``(i * stride - pad + k_h * dilation + offset_h, j * stride - pad + k_w * dilation + offset_w)``,
bilinearly, zero outside the image (what ONNX's reference does through GridSample). One MIL
``resample`` in unnormalised pixel coordinates fetches every tap of every output pixel, the
offset groups folded into its batch; the optional mask scales the samples; the weights then
reduce (channel, tap) pairs as a 1x1 conv with the node's groups.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._nn_util import as_float, float_np, static_shape
from edgebuild_coreml.lowering.registry import lowers


def _pair(ctx, node, name: str, default: list[int], size: int = 2) -> list[int]:
    values = [int(v) for v in ctx.attr(node, name, default)]
    if len(values) != size:
        ctx.fail(node, f"{name} {values} must hold {size} values for a 2-D DeformConv")
    return values


@lowers("DeformConv", since=19)
def deform_conv(ctx, node):
    x, weight, offset = (as_float(ctx.input(node, i)) for i in range(3))
    bias = as_float(ctx.input(node, 3, optional=True))
    mask = as_float(ctx.input(node, 4, optional=True))
    x_shape, w_shape, offset_shape = static_shape(x), static_shape(weight), static_shape(offset)
    if x_shape is None or w_shape is None or offset_shape is None:
        ctx.fail(node, "X, W and offset need static shapes", hint="pin the input shapes in the recipe's source.inputs")
    if len(x_shape) != 4:
        ctx.fail(node, f"only 2-D DeformConv (a rank-4 X) is supported; X has rank {len(x_shape)}")
    batch, channels, height, width = x_shape
    out_channels, group_channels, kh, kw = w_shape
    kernel = _pair(ctx, node, "kernel_shape", [kh, kw])
    if kernel != [kh, kw]:
        ctx.fail(node, f"kernel_shape {kernel} differs from the weight's {[kh, kw]}")
    strides = _pair(ctx, node, "strides", [1, 1])
    dilations = _pair(ctx, node, "dilations", [1, 1])
    pads = _pair(ctx, node, "pads", [0, 0, 0, 0], 4)
    groups = int(ctx.attr(node, "group", 1))
    offset_groups = int(ctx.attr(node, "offset_group", 1))
    taps = kh * kw
    out_h, out_w = offset_shape[2:]
    if channels != group_channels * groups or channels % offset_groups or offset_shape[1] != offset_groups * taps * 2:
        ctx.fail(node, f"X {x_shape}, W {w_shape} and offset {offset_shape} disagree with group {groups} and "
                       f"offset_group {offset_groups}")
    dtype = float_np(x)

    # Where each tap of each output pixel sits before its offset: [taps, out_h, out_w].
    tap_h, tap_w = np.meshgrid(np.arange(kh) * dilations[0], np.arange(kw) * dilations[1], indexing="ij")
    rows = np.arange(out_h) * strides[0] - pads[0]
    cols = np.arange(out_w) * strides[1] - pads[1]
    grid = (taps, out_h, out_w)
    base_h = np.broadcast_to(tap_h.reshape(-1, 1, 1) + rows[None, :, None], grid).astype(dtype)
    base_w = np.broadcast_to(tap_w.reshape(-1, 1, 1) + cols[None, None, :], grid).astype(dtype)

    split = mb.reshape(x=offset, shape=np.array([batch, offset_groups, taps, 2, out_h, out_w], np.int32),
                       name=ctx.name(node, "offsets"))
    at_h = mb.add(x=mb.gather(x=split, indices=np.int32(0), axis=3), y=base_h, name=ctx.name(node, "at_h"))
    at_w = mb.add(x=mb.gather(x=split, indices=np.int32(1), axis=3), y=base_w, name=ctx.name(node, "at_w"))
    points = mb.stack(values=[at_w, at_h], axis=-1, name=ctx.name(node, "points"))  # [N, G, taps, oh, ow, 2]
    points = mb.reshape(x=points, shape=np.array([batch * offset_groups, taps * out_h, out_w, 2], np.int32),
                        name=ctx.name(node, "grid"))
    images = mb.reshape(x=x, shape=np.array([batch * offset_groups, channels // offset_groups, height, width], np.int32),
                        name=ctx.name(node, "per_offset_group"))
    samples = mb.resample(x=images, coordinates=points, sampling_mode="bilinear", padding_mode="constant",
                          padding_value=0.0, coordinates_mode="unnormalized", align_corners=True,
                          name=ctx.name(node, "samples"))  # [N*G, C/G, taps*oh, ow]
    samples = mb.reshape(x=samples, shape=np.array([batch, offset_groups, channels // offset_groups, taps, out_h, out_w],
                                                   np.int32), name=ctx.name(node, "taps"))
    if mask is not None:
        scale = mb.reshape(x=mask, shape=np.array([batch, offset_groups, 1, taps, out_h, out_w], np.int32),
                           name=ctx.name(node, "mask"))
        samples = mb.mul(x=samples, y=scale, name=ctx.name(node, "masked"))
    columns = mb.reshape(x=samples, shape=np.array([batch, channels * taps, out_h, out_w], np.int32),
                         name=ctx.name(node, "columns"))
    # Channel c's tap k is column c * taps + k, the order of W's flattened (C/group, kh, kw).
    if isinstance(weight, np.ndarray):
        flat_weight = weight.reshape(out_channels, group_channels * taps, 1, 1).astype(dtype)
    else:
        flat_weight = mb.reshape(x=weight, shape=np.array([out_channels, group_channels * taps, 1, 1], np.int32),
                                 name=ctx.name(node, "weight"))
    kwargs = {"bias": bias} if bias is not None else {}
    return mb.conv(x=columns, weight=flat_weight, groups=groups, pad_type="valid", name=ctx.name(node), **kwargs)
