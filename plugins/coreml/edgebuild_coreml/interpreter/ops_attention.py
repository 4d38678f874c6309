"""``scaled_dot_product_attention`` (iOS18), as PyTorch's function without dropout/causal."""

from __future__ import annotations

import numpy as np

from edgebuild.plugin.reference import attention

from ._params import as_float
from .registry import evaluates


@evaluates("scaled_dot_product_attention")
def scaled_dot_product_attention(op, x):
    mask = x.get("attn_mask")
    if mask is not None and np.asarray(mask).dtype != bool:  # a bool mask selects, a float one is added
        mask = as_float(mask)
    return attention.scaled_dot_product_attention(as_float(x["query"]), as_float(x["key"]), as_float(x["value"]), mask)
