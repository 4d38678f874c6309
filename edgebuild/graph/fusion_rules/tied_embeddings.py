"""Tied embeddings: the LM head reads the token embedding table through a Transpose.

GPT-2, Gemma and many small decoders use one table for both ends: ``Gather(E, ids)`` and
``MatMul(h, Transpose(E))``. Folding the Transpose would store a transposed second copy. The
rule writes the head as ``edgebuild::Linear(h, E^T)`` instead: Linear's weight is laid out
[in, out], so backends that keep weights as [out, in] (Core ML's ``linear``) get back
exactly ``E``, the embedding's own values, and store them once (Core ML's const
deduplication merges the two).
"""

from __future__ import annotations

import numpy as np
from onnxscript.rewriter import pattern

from edgebuild.graph.fusion_rules._values import (
    EDGEBUILD_DOMAIN,
    const_array,
    new_initializer,
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
    weight = new_initializer(op, np.ascontiguousarray(array.T), table, "tied_head")
    return op.Linear(x, weight, _domain=EDGEBUILD_DOMAIN)


def rules() -> list[pattern.RewriteRule]:
    return [pattern.RewriteRule(_target, _replacement, name="tied_embedding_head")]
