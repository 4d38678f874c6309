"""RMSNormalization (opset 23): ``x / sqrt(mean(x^2 over axis..last) + epsilon) * scale``."""

from __future__ import annotations

from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import normalize_axis, rank_of
from edgebuild_coreml.lowering.registry import lowers


@lowers("RMSNormalization", since=23)
def rms_normalization(ctx, node):
    x, scale = ctx.input(node, 0), ctx.input(node, 1)
    epsilon = float(ctx.attr(node, "epsilon", 1e-5))
    return rms_norm(ctx, node, x, scale, int(ctx.attr(node, "axis", -1)), epsilon)


def rms_norm(ctx, node, x, scale, axis: int, epsilon: float, *, inv_rms: bool = False, name: str | None = None):
    """``x * rsqrt(mean(x^2 over axis..) + epsilon) * scale``, or ``(y, 1/rms)`` (kept dims) when
    ``inv_rms``. ``name``: of ``y``."""
    rank = rank_of(x)
    axis = normalize_axis(ctx, node, axis, rank)
    mean_square = mb.reduce_mean(x=mb.mul(x=x, y=x), axes=list(range(axis, rank)), keep_dims=True)
    inverse_rms = mb.rsqrt(x=mean_square, epsilon=epsilon)
    y = mb.mul(x=mb.mul(x=x, y=inverse_rms), y=scale, name=name or ctx.name(node))
    return (y, inverse_rms) if inv_rms else y
