"""GridSample: MIL ``resample`` where it matches ONNX, else an exact gather decomposition.

``resample`` covers 4-D inputs with linear sampling and zeros or border padding. Everything
else goes through ``_grid_sampling`` (gathers and arithmetic): cubic (no MIL form), 5-D
volumes (resample is 2-D), nearest (ONNX rounds exact halves to even, resample rounds them
up) and reflection (ONNX reflects the continuous coordinate, resample reflects indices).
"""

from __future__ import annotations

from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._grid_sampling import grid_sample_by_gather
from edgebuild_coreml.lowering.ops._nn_util import as_float, is_float, static_shape
from edgebuild_coreml.lowering.ops._util import rank_of
from edgebuild_coreml.lowering.registry import lowers

_MODES = {"linear": "linear", "bilinear": "linear", "nearest": "nearest", "cubic": "cubic", "bicubic": "cubic"}
_PADDINGS = ("zeros", "border", "reflection")
_RESAMPLE_PADDING = {"zeros": "constant", "border": "border"}


def _text(value, default: str) -> str:
    value = default if value is None else value
    return value.decode() if isinstance(value, bytes) else str(value)


@lowers("GridSample", since=16, until=19)
def grid_sample_bilinear_default(ctx, node):
    """GridSample-16 names its modes bilinear/bicubic/nearest, bilinear by default."""
    return _grid_sample(ctx, node, default_mode="bilinear")


@lowers("GridSample", since=20)
def grid_sample(ctx, node):
    """GridSample-20 names them linear/cubic/nearest, linear by default."""
    return _grid_sample(ctx, node, default_mode="linear")


def _grid_sample(ctx, node, default_mode: str):
    x, grid = as_float(ctx.input(node, 0)), as_float(ctx.input(node, 1))
    rank = rank_of(x)
    mode_name = _text(ctx.attr(node, "mode"), default_mode)
    padding = _text(ctx.attr(node, "padding_mode"), "zeros")
    align_corners = bool(ctx.attr(node, "align_corners", 0))
    if mode_name not in _MODES:
        ctx.fail(node, f"unknown mode {mode_name!r}")
    if padding not in _PADDINGS:
        ctx.fail(node, f"unknown padding_mode {padding!r}")
    if not is_float(x) or not is_float(grid):
        ctx.fail(node, "GridSample samples float tensors", "cast the input and grid to float")
    mode = _MODES[mode_name]
    if rank == 4 and mode == "linear" and padding in _RESAMPLE_PADDING:
        return mb.resample(
            x=x, coordinates=grid, sampling_mode="bilinear", padding_mode=_RESAMPLE_PADDING[padding],
            padding_value=0.0, coordinates_mode="normalized_minus_one_to_one", align_corners=align_corners,
            name=ctx.name(node),
        )
    if rank < 3:
        ctx.fail(node, f"a rank-{rank} input has no spatial axes to sample")
    shape, grid_shape = static_shape(x), static_shape(grid)
    if shape is None or grid_shape is None:
        ctx.fail(node, f"{mode} sampling with {padding} padding on a rank-{rank} input is built from gathers, "
                 "which need static input and grid shapes", "pin the input shapes in the recipe")
    if len(grid_shape) != rank or grid_shape[-1] != rank - 2 or grid_shape[0] != shape[0]:
        ctx.fail(node, f"grid shape {grid_shape} does not fit input shape {shape}: expected (N, *out, {rank - 2})")
    return grid_sample_by_gather(ctx, node, x, grid, shape=shape, grid_shape=grid_shape, mode=mode,
                                 padding=padding, align_corners=align_corners)
