"""The Core ML lowering of Swish2: ``x * sigmoid(beta * x)`` in MIL ops."""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types

from edgebuild.plugin import LoweringSet

from edgebuild_swish import DOMAIN, OP_TYPE

LOWERINGS = LoweringSet("coreml")


@LOWERINGS.lowers(OP_TYPE, domain=DOMAIN)
def lower_swish2(ctx, node):
    x = ctx.input(node, 0)
    beta = float(ctx.attr(node, "beta", 1.0))
    float_type = np.float16 if getattr(x, "dtype", None) == types.fp16 else np.float32
    scaled = mb.mul(x=x, y=float_type(beta), name=ctx.name(node, "scaled"))
    gate = mb.sigmoid(x=scaled, name=ctx.name(node, "gate"))
    return mb.mul(x=x, y=gate, name=ctx.name(node))
