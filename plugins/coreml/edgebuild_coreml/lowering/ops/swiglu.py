"""``edgebuild::SwiGLU(gate, up)``: ``silu(gate) * up``, the gated MLP the fuse_gated_mlp pass finds.

MIL has ``silu`` as one op: the gate costs one activation and one multiply, where the
written-out ``x * sigmoid(x) * up`` would take three ops.
"""

from __future__ import annotations

from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._nn_util import as_float
from edgebuild_coreml.lowering.registry import lowers


@lowers("SwiGLU", domain="edgebuild")
def swiglu(ctx, node):
    gate, up = as_float(ctx.input(node, 0)), as_float(ctx.input(node, 1))
    return mb.mul(x=mb.silu(x=gate, name=ctx.name(node, "gate")), y=up, name=ctx.name(node))
