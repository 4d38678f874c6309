"""Ops that move data without computing on it: ``broadcast_in_dim``, ``reshape``, ``transpose``."""

from __future__ import annotations

from edgebuild_jax.convert.context import int_list
from edgebuild_jax.convert.registry import converts


@converts("stablehlo.broadcast_in_dim")
def broadcast_in_dim(op, cx):
    """Operand dim i goes to result dim ``broadcast_dimensions[i]``: put the operand's dims in that
    order (a transpose when they are not increasing), unsqueeze the new ones, then Expand."""
    (x,) = cx.inputs(op)
    mapping = int_list(op.attributes["broadcast_dimensions"])
    target = cx.shape(op.result)
    order = sorted(range(len(mapping)), key=lambda i: mapping[i])
    if order != list(range(len(mapping))):
        x = cx.node("Transpose", [x], {"perm": order})
    placed = sorted(mapping)
    new_axes = [d for d in range(len(target)) if d not in placed]
    if new_axes:
        x = cx.node("Unsqueeze", [x, cx.ints(new_axes)])
    if None in target:
        raise cx.error(op, "a broadcast to a dynamic shape needs dynamic_broadcast_in_dim")
    return [cx.node("Expand", [x, cx.ints(target)])]


@converts("stablehlo.reshape")
def reshape(op, cx):
    (x,) = cx.inputs(op)
    return [cx.node("Reshape", [x, cx.ints(cx.shape(op.result))])]


@converts("stablehlo.transpose")
def transpose(op, cx):
    (x,) = cx.inputs(op)
    return [cx.node("Transpose", [x], {"perm": int_list(op.attributes["permutation"])})]
