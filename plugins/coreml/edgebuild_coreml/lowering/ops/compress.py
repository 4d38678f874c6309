"""Compress with a constant condition: a gather of the selected indices (MIL has no
data-dependent output shapes, so a runtime condition is refused)."""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import normalize_axis, rank_of
from edgebuild_coreml.lowering.registry import lowers


@lowers("Compress", since=9)
def compress(ctx, node):
    x = ctx.input(node, 0)
    condition = np.asarray(ctx.const(node, 1, what="condition")).reshape(-1).astype(bool)
    selected = np.nonzero(condition)[0].astype(np.int32)
    if selected.size == 0:
        ctx.fail(node, "the condition selects nothing, and Core ML tensors cannot be empty")
    axis = ctx.attr(node, "axis")
    if axis is None:
        x, axis = mb.reshape(x=x, shape=[-1]), 0
    else:
        axis = normalize_axis(ctx, node, int(axis), rank_of(x))
    return mb.gather(x=x, indices=selected, axis=axis, name=ctx.name(node))
