"""``scaled_dot_product_attention`` (iOS18), as PyTorch's function without dropout/causal."""

from __future__ import annotations

import numpy as np

from ._params import as_float
from .registry import evaluates


@evaluates("scaled_dot_product_attention")
def scaled_dot_product_attention(op, x):
    query, key, value = as_float(x["query"]), as_float(x["key"]), as_float(x["value"])
    scores = np.matmul(query, np.swapaxes(key, -1, -2)) / np.sqrt(query.shape[-1]).astype(query.dtype)
    mask = x.get("attn_mask")
    if mask is not None:
        mask = np.asarray(mask)
        # A bool mask says which positions take part; a float mask is added to the scores.
        scores = np.where(mask, scores, -np.inf) if mask.dtype == bool else scores + as_float(mask)
    scores = scores - np.max(scores, axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights = weights / np.sum(weights, axis=-1, keepdims=True)
    return np.matmul(weights, value)
