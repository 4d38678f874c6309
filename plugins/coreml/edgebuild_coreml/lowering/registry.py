"""Collects this plugin's op lowerings; :mod:`edgebuild_coreml.plugin` registers them.

One module per op family under ``ops/`` decorates its functions::

    @lowers("Relu")
    def relu(ctx, node):
        return mb.relu(x=ctx.input(node, 0), name=ctx.name(node))

A lowering returns one MIL Var, or a tuple with one entry per ONNX output (None for an
optional output it does not produce). The converter binds them to the node's outputs.
"""

from __future__ import annotations

from edgebuild.plugin import LoweringSet

LOWERINGS = LoweringSet("coreml")
lowers = LOWERINGS.lowers
