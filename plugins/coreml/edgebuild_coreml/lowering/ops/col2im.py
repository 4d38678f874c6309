"""Col2Im: sliding blocks summed back into an image, as a transposed conv with one-hot weights.

Col2Im is the adjoint of im2col: every column entry (channel c, kernel offset j, block b) adds
into the image pixel that block b's offset j covers. A grouped ``conv_transpose`` with one group
per channel and a weight that is 1 at offset j of input channel c*K + j does exactly that sum;
the pads are cut off afterwards.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._nn_util import as_float, float_np, static_shape
from edgebuild_coreml.lowering.registry import lowers


def _ints(ctx, node, name: str, default: list[int], size: int) -> list[int]:
    values = [int(v) for v in ctx.attr(node, name, default)]
    if len(values) != size:
        ctx.fail(node, f"{name} holds {len(values)} values; a {size // (2 if name == 'pads' else 1)}-D image needs {size}")
    return values


@lowers("Col2Im", since=18)
def col2im(ctx, node):
    x = as_float(ctx.input(node, 0))
    image = [int(v) for v in np.asarray(ctx.const(node, 1, what="image_shape")).reshape(-1)]
    block = [int(v) for v in np.asarray(ctx.const(node, 2, what="block_shape")).reshape(-1)]
    spatial = len(image)
    if len(block) != spatial or not 1 <= spatial <= 3:
        ctx.fail(node, f"image_shape {image} and block_shape {block} must name the same 1 to 3 spatial dims")
    shape = static_shape(x)
    if shape is None or len(shape) != 3:
        ctx.fail(node, "the input must be [N, C * prod(block_shape), L] with a static shape",
                 hint="pin the input shapes in the recipe's source.inputs")
    strides = _ints(ctx, node, "strides", [1] * spatial, spatial)
    dilations = _ints(ctx, node, "dilations", [1] * spatial, spatial)
    pads = _ints(ctx, node, "pads", [0] * 2 * spatial, 2 * spatial)
    kernel_size = int(np.prod(block))
    batch, rows, columns = shape
    if rows % kernel_size:
        ctx.fail(node, f"input dim 1 ({rows}) is not a multiple of prod(block_shape) = {kernel_size}")
    channels = rows // kernel_size
    blocks = [(size + pads[d] + pads[spatial + d] - dilations[d] * (block[d] - 1) - 1) // strides[d] + 1
              for d, size in enumerate(image)]
    if min(blocks) < 1 or int(np.prod(blocks)) != columns:
        ctx.fail(node, f"image_shape {image}, block_shape {block}, pads, strides and dilations give blocks "
                       f"{blocks}, but the input holds {columns} of them")

    grid = mb.reshape(x=x, shape=np.array([batch, rows, *blocks], np.int32), name=ctx.name(node, "blocks"))
    weight = np.zeros((rows, 1, *block), dtype=float_np(x))
    for j, offset in enumerate(np.ndindex(*block)):
        weight[(slice(j, None, kernel_size), 0, *offset)] = 1.0
    full = mb.conv_transpose(x=grid, weight=weight, strides=strides, dilations=dilations, groups=channels,
                             pad_type="valid", name=ctx.name(node, "sum"))
    full_sizes = [(b - 1) * s + (k - 1) * d + 1 for b, s, k, d in zip(blocks, strides, block, dilations)]
    # The padded image can extend past the last block by less than a stride: those pixels get nothing.
    short = [max(pads[d] + image[d] - full_sizes[d], 0) for d in range(spatial)]
    if any(short):
        full = mb.pad(x=full, pad=np.array([0, 0, 0, 0] + [v for s in short for v in (0, s)], np.int32),
                      mode="constant", constant_val=0.0, name=ctx.name(node, "tail"))
    begin = [0, 0] + pads[:spatial]
    end = [batch, channels] + [pads[d] + image[d] for d in range(spatial)]
    return mb.slice_by_index(x=full, begin=np.array(begin, np.int32), end=np.array(end, np.int32), name=ctx.name(node))
