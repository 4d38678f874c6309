"""RMSNormalization (opset 23): ``x / sqrt(mean(x^2 over axis..last) + epsilon) * scale``."""

from __future__ import annotations

from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import normalize_axis, rank_of
from edgebuild_coreml.lowering.registry import lowers


@lowers("RMSNormalization", since=23)
def rms_normalization(ctx, node):
    x, scale = ctx.input(node, 0), ctx.input(node, 1)
    rank = rank_of(x)
    axis = normalize_axis(ctx, node, int(ctx.attr(node, "axis", -1)), rank)
    epsilon = float(ctx.attr(node, "epsilon", 1e-5))
    mean_square = mb.reduce_mean(x=mb.mul(x=x, y=x), axes=list(range(axis, rank)), keep_dims=True)
    inverse_rms = mb.rsqrt(x=mean_square, epsilon=epsilon)
    return mb.mul(x=mb.mul(x=x, y=inverse_rms), y=scale, name=ctx.name(node))
