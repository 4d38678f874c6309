"""A tied LM head reads the embedding table's own constant.

The graph pass ``share_tied_embeddings`` writes a tied head as ``edgebuild::Linear`` whose
[out, in] weight equals the embedding table. Equal values are not enough once the program is
cast to fp16 without a deduplication pass after the casts: each const gets its own fp16 copy.
So the head's linear takes the very const Var the embedding's ``gather`` reads, and the cast
(one per Var) and the weight file hold the table once.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil.mil.block import curr_block


def embedding_table(weight: np.ndarray):
    """The const Var of a ``gather`` table in the current block equal to ``weight``, or None."""
    if weight.ndim != 2:
        return None
    for op in curr_block().operations:
        if op.op_type != "gather" or op.x.op is None or op.x.op.op_type != "const":
            continue
        table = op.x.val
        if (isinstance(table, np.ndarray) and table.shape == weight.shape and table.dtype == weight.dtype
                and int(op.axis.val) == 0 and _equal(table, weight)):
            return op.x
    return None


def _equal(table: np.ndarray, weight: np.ndarray) -> bool:
    """Equal tables; a few rows first, since an untied head differs at once and the full comparison
    reads both (hundreds of MB)."""
    return np.array_equal(table[:4], weight[:4]) and np.array_equal(table, weight)
