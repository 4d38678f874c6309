"""GridSample on 4-D inputs as MIL ``resample``: bilinear sampling with zeros or border padding.

Rejected, since MIL cannot match ONNX there: cubic (no MIL form), 5-D grids (resample is
2-D), nearest (ONNX rounds exact halves to even, resample rounds them up) and reflection
(ONNX reflects the continuous coordinate before interpolating, resample reflects indices).
"""

from __future__ import annotations

from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import rank_of
from edgebuild_coreml.lowering.registry import lowers

_MODES = {"linear": "bilinear", "bilinear": "bilinear"}
_PADDING = {"zeros": "constant", "border": "border"}


def _text(value, default: str) -> str:
    value = default if value is None else value
    return value.decode() if isinstance(value, bytes) else str(value)


@lowers("GridSample", since=16)
def grid_sample(ctx, node):
    x, grid = ctx.input(node, 0), ctx.input(node, 1)
    if rank_of(x) != 4:
        ctx.fail(node, "only 4-D (N, C, H, W) inputs are supported: MIL resample is 2-D")
    mode = _text(ctx.attr(node, "mode"), "linear" if ctx.opset >= 20 else "bilinear")
    padding = _text(ctx.attr(node, "padding_mode"), "zeros")
    if mode not in _MODES:
        ctx.fail(node, f"mode {mode!r} is not supported: only linear sampling matches ONNX in MIL resample")
    if padding not in _PADDING:
        ctx.fail(node, f"padding_mode {padding!r} is not supported: only zeros and border match ONNX")
    return mb.resample(
        x=x, coordinates=grid, sampling_mode=_MODES[mode], padding_mode=_PADDING[padding], padding_value=0.0,
        coordinates_mode="normalized_minus_one_to_one", align_corners=bool(ctx.attr(node, "align_corners", 0)),
        name=ctx.name(node),
    )
