"""A node a graph pass (or a backend's support check) declines to rewrite in its form, and why.

A pass that handles some forms of an op (a decomposition of the forward direction only, say)
leaves the others in the graph for the backend. Marking the node with the reason lets the backend,
which then finds no lowering for it, say which form was declined and why instead of "no lowering".
The mark is node metadata, so it survives the stage files between the optimise and lower stages.
"""

from __future__ import annotations

import onnx_ir as ir

DECLINED = "edgebuild.declined"  # node metadata key: the reason the node's form was declined


def mark_declined(node: ir.Node, reason: str) -> None:
    """Record that ``node`` stays as it is because its form is declined: ``reason`` names the
    attribute, input or shape ("direction 'bidirectional' is not decomposed")."""
    node.metadata_props[DECLINED] = reason


def declined_reason(node: ir.Node) -> str | None:
    """The reason a pass recorded with :func:`mark_declined`, or None."""
    return node.metadata_props.get(DECLINED)
