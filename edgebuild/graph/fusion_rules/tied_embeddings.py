"""Tied embeddings: the LM head reads the token embedding table.

GPT-2, Gemma and many small decoders use one table for both ends: ``Gather(E, ids)`` and
``MatMul(h, Transpose(E))``. Folding the Transpose would store a transposed second copy. The
rule writes the head as ``edgebuild::Linear(h, Transpose(E))`` instead, the Transpose kept
(the optimise stage does not fold a weight's): Linear's weight is laid out [in, out], so
backends that keep weights as [out, in] (Core ML's ``linear``) read exactly ``E`` through it,
the embedding's own values, and store them once.

Exporters often fold that Transpose themselves (torch's optimiser; the PyTorch plugin turns it
into a lazily transposed initializer): the head is then ``MatMul(h, W)`` with ``W`` a second
initializer equal to ``E^T``. Its values are compared with every embedding table of the
graph, and an equal one makes it the same ``Linear``, so the backend sees ``E`` twice and
keeps it once.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from edgebuild.graph.fusion_rules._values import (
    EDGEBUILD_DOMAIN,
    const_array,
)


def _target(op, x, table):
    return op.MatMul(x, op.Transpose(table, _allow_other_attributes=True, _outputs=["transposed"]))


def _replacement(op, x, table, transposed):
    array = const_array(table)
    perm = transposed.producer().attributes.get("perm")
    if array is None or array.ndim != 2 or (perm is not None and list(perm.as_ints()) != [1, 0]):
        return None
    if not any(use.node.op_type == "Gather" for use in table.uses()):
        return None  # not an embedding table: fuse_bias's constant folding handles the rest
    # read through the Transpose, not folded: backends that keep weights [out, in] get E itself
    return op.Linear(x, op.Transpose(table, perm=[1, 0]), _domain=EDGEBUILD_DOMAIN)


def _folded_target(op, x, weight):
    return op.MatMul(x, weight)


def _embedding_tables(graph: ir.Graph | None) -> list[ir.Value]:
    """Constant 2-D data inputs of the graph's Gathers along axis 0 (token embedding tables)."""
    if graph is None:
        return []
    found = []
    for node in graph:
        if node.op_type != "Gather" or node.domain not in ("", "ai.onnx"):
            continue
        axis = node.attributes.get("axis")
        table = node.inputs[0]
        if (axis is None or axis.as_int() == 0) and table is not None and table.is_initializer() \
                and table.shape is not None and len(table.shape) == 2 and table not in found:
            found.append(table)
    return found


def _same_table(table, head) -> bool:
    """Whether two [V, H] tables are equal; a few rows first, since untied ones differ at once and a
    full comparison reads both (hundreds of MB, one of them through a transposed view)."""
    if table is None or table.shape != head.shape:
        return False
    return np.array_equal(table[:4], head[:4]) and np.array_equal(table, head)


def _folded_replacement(op, x, weight):
    if not weight.is_initializer() or weight.shape is None or len(weight.shape) != 2:
        return None
    tables = [t for t in _embedding_tables(weight.graph) if list(t.shape) == list(weight.shape)[::-1]]
    if not tables:
        return None  # checked by shape first: only a head as wide as an embedding table is read
    array = const_array(weight)
    if array is None or not any(_same_table(const_array(t), array.T) for t in tables):
        return None
    return op.Linear(x, weight, _domain=EDGEBUILD_DOMAIN)


def rules() -> list[pattern.RewriteRule]:
    return [pattern.RewriteRule(_target, _replacement, name="tied_embedding_head"),
            pattern.RewriteRule(_folded_target, _folded_replacement, name="tied_embedding_folded_head")]
