"""AffineGrid: sampling grids for GridSample, as one matmul of a constant base grid by theta."""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._nn_util import as_float, float_np, shape_of
from edgebuild_coreml.lowering.registry import lowers


def _positions(size: int, align_corners: bool) -> np.ndarray:
    """Normalised [-1, 1] coordinates of ``size`` pixels: their corners' (a single pixel sits at -1,
    as ONNX's linspace puts it) or their centres'."""
    if align_corners:
        return np.linspace(-1.0, 1.0, size)
    return (2.0 * np.arange(size) + 1.0) / size - 1.0


def base_grid(spatial: list[int], align_corners: bool) -> np.ndarray:
    """[prod(spatial), len(spatial) + 1] rows of (x, y[, z], 1), x running fastest (ONNX order)."""
    axes = np.meshgrid(*(_positions(s, align_corners) for s in spatial), indexing="ij")
    coordinates = [axis.reshape(-1) for axis in reversed(axes)]  # innermost dim is x
    return np.stack(coordinates + [np.ones(int(np.prod(spatial)))], axis=1)


@lowers("AffineGrid", since=20)
def affine_grid(ctx, node):
    theta = as_float(ctx.input(node, 0))
    size = [int(v) for v in np.asarray(ctx.const(node, 1, what="size")).reshape(-1)]
    if len(size) not in (4, 5):
        ctx.fail(node, f"size {size} must be [N, C, H, W] or [N, C, D, H, W]")
    spatial = size[2:]
    dims = len(spatial)
    if tuple(shape_of(theta)[1:]) != (dims, dims + 1):
        ctx.fail(node, f"theta has shape {tuple(shape_of(theta))}; a {dims}-D grid needs [N, {dims}, {dims + 1}]")
    base = base_grid(spatial, bool(ctx.attr(node, "align_corners", 0))).astype(float_np(theta))
    # grid[n, p] = theta[n] @ base[p]  ->  base @ theta[n]^T for all points at once
    points = mb.matmul(x=base, y=theta, transpose_y=True, name=ctx.name(node, "points"))  # [N, P, dims]
    return mb.reshape(x=points, shape=np.array([-1, *spatial, dims], np.int32), name=ctx.name(node))
