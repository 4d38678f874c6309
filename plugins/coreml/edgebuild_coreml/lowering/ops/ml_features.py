"""ai.onnx.ml ArrayFeatureExtractor: columns of the last axis, chosen by index.

As onnxruntime does, a 1-D input gives a one-row matrix, and the indices are taken flattened.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import dtype_of, rank_of
from edgebuild_coreml.lowering.registry import lowers


@lowers("ArrayFeatureExtractor", domain="ai.onnx.ml", since=1)
def array_feature_extractor(ctx, node):
    x, indices = ctx.input(node, 0), ctx.input(node, 1)
    if dtype_of(indices) != "int32":
        ctx.fail(node, "the indices must be integers")
    flat = indices.reshape(-1) if isinstance(indices, np.ndarray) else mb.reshape(
        x=indices, shape=[-1], name=ctx.name(node, "indices"))
    if rank_of(x) == 1:
        x = mb.expand_dims(x=x, axes=[0], name=ctx.name(node, "row"))
    return mb.gather(x=x, indices=flat, axis=-1, name=ctx.name(node))
