"""Scaled dot-product attention."""

from __future__ import annotations

import numpy as np

from edgebuild.reference.reductions import softmax


def scaled_dot_product_attention(q, k, v, mask=None, scale: float | None = None) -> np.ndarray:
    """``softmax(q @ swapaxes(k, -1, -2) * scale + mask, axis=-1) @ v`` in ``q``'s dtype.

    ``k`` is ``[..., Lk, D]``. Without ``scale`` the scores are divided by ``sqrt(D)``. A boolean
    ``mask`` says which positions take part (the others get -inf); any other is added.
    Grouped-query attention: when ``k``/``v`` have ``Hkv`` heads (axis -3) and ``q`` a multiple
    ``Hkv * G``, query head ``h`` attends with K/V head ``h // G``.
    """
    k, v = grouped_heads(q, k), grouped_heads(q, v)
    scores = np.matmul(q, np.swapaxes(k, -1, -2))
    if scale is None:
        scores = scores / np.sqrt(q.shape[-1]).astype(q.dtype)
    else:
        scores = scores * np.asarray(scale, dtype=q.dtype)
    if mask is not None:
        mask = np.asarray(mask)
        scores = np.where(mask, scores, -np.inf) if mask.dtype == bool else scores + mask
    return np.matmul(softmax(scores, axis=-1), v).astype(q.dtype, copy=False)


def grouped_heads(q: np.ndarray, kv: np.ndarray) -> np.ndarray:
    """``kv`` with each of its heads repeated for its group of ``q``'s heads (axis -3)."""
    if q.ndim < 3 or kv.ndim < 3 or kv.shape[-3] in (1, q.shape[-3]):
        return kv
    if q.shape[-3] % kv.shape[-3]:
        raise ValueError(f"{q.shape[-3]} query heads cannot share {kv.shape[-3]} key/value heads evenly")
    return np.repeat(kv, q.shape[-3] // kv.shape[-3], axis=-3)
