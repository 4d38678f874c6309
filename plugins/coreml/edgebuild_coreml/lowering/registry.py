"""Collects this plugin's op lowerings; :mod:`edgebuild_coreml.plugin` registers them.

One module per op family under ``ops/`` decorates its functions::

    @lowers("Relu")
    def relu(ctx, node):
        return mb.relu(x=ctx.input(node, 0), name=ctx.name(node))

A lowering returns one MIL Var, or a tuple with one entry per ONNX output (None for an
optional output it does not produce). The converter binds them to the node's outputs.
"""

from __future__ import annotations

from typing import Callable

LOWERINGS: list[tuple[str, str, int, int | None, Callable]] = []


def lowers(*op_types: str, domain: str = "", since: int = 1, until: int | None = None):
    """Declare ``fn`` as the lowering of ``op_types`` for model opsets ``[since, until]``."""

    def decorate(fn: Callable) -> Callable:
        for op_type in op_types:
            LOWERINGS.append((domain, op_type, since, until, fn))
        return fn

    return decorate
