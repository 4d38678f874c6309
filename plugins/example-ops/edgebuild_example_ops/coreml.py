"""Core ML lowering of RMSNorm by decomposition into MIL ops (no custom layer needed).

Follows edgebuild-coreml's lowering contract: ``fn(ctx, node)`` returns the MIL Var of the
op's single output, the final op named ``ctx.name(node)``.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types


def lower_rms_norm(ctx, node):
    x = ctx.input(node, 0)
    scale = ctx.input(node, 1)
    epsilon = float(ctx.attr(node, "epsilon", 1e-6))
    float_type = np.float16 if getattr(x, "dtype", None) == types.fp16 else np.float32
    if isinstance(scale, np.ndarray):
        scale = scale.astype(float_type)
    squared = mb.mul(x=x, y=x, name=ctx.name(node, "squared"))
    mean_square = mb.reduce_mean(x=squared, axes=[-1], keep_dims=True, name=ctx.name(node, "mean_square"))
    inv_rms = mb.rsqrt(x=mean_square, epsilon=float_type(epsilon), name=ctx.name(node, "inv_rms"))
    normalised = mb.mul(x=x, y=inv_rms, name=ctx.name(node, "normalised"))
    return mb.mul(x=normalised, y=scale, name=ctx.name(node))
