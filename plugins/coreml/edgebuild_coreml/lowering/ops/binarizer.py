"""ai.onnx.ml Binarizer: 1 where the input exceeds ``threshold``, else 0, in the input's dtype."""

from __future__ import annotations

from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import const_like, dtype_of
from edgebuild_coreml.lowering.registry import lowers


@lowers("Binarizer", domain="ai.onnx.ml")
def binarizer(ctx, node):
    x = ctx.input(node, 0)
    above = mb.greater(x=x, y=const_like(float(ctx.attr(node, "threshold", 0.0)), x))
    return mb.cast(x=above, dtype=dtype_of(x), name=ctx.name(node))
