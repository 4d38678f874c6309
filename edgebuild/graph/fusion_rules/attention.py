"""Attention written out -> ``edgebuild::ScaledDotProductAttention(Q, K, V, mask?, scale)``.

Matches ``Softmax(MatMul(Q, Transpose(K')) [* s | / s] [+ mask]) @ V``. The fused op takes
K as ``[..., Lk, D]``: when the Transpose does more than swap the last two axes (exporters
often fold the head split into it, e.g. perm [0, 2, 3, 1]) the remaining permutation is
kept as a Transpose in front of K.
"""

from __future__ import annotations

from onnxscript.rewriter import pattern

from edgebuild.graph.fusion_rules._values import EDGEBUILD_DOMAIN, int_attr, rank, scalar


def _scores(op, q, kt_src):
    return op.MatMul(q, op.Transpose(kt_src, _outputs=["kt"]))


def _plain(op, q, kt_src, v):
    return op.MatMul(op.Softmax(_scores(op, q, kt_src), _outputs=["probs"]), v)


def _masked(op, q, kt_src, v, mask):
    return op.MatMul(op.Softmax(op.Add(_scores(op, q, kt_src), mask), _outputs=["probs"]), v)


def _scaled_mul(op, q, kt_src, v, s):
    return op.MatMul(op.Softmax(op.Mul(_scores(op, q, kt_src), s), _outputs=["probs"]), v)


def _scaled_div(op, q, kt_src, v, d):
    return op.MatMul(op.Softmax(op.Div(_scores(op, q, kt_src), d), _outputs=["probs"]), v)


def _scaled_mul_masked(op, q, kt_src, v, s, mask):
    scores = op.Add(op.Mul(_scores(op, q, kt_src), s), mask)
    return op.MatMul(op.Softmax(scores, _outputs=["probs"]), v)


def _scaled_div_masked(op, q, kt_src, v, d, mask):
    scores = op.Add(op.Div(_scores(op, q, kt_src), d), mask)
    return op.MatMul(op.Softmax(scores, _outputs=["probs"]), v)


def _sdpa(op, q, kt_src, v, kt, probs, s=None, d=None, mask=None):
    softmax = probs.producer()
    axis = int_attr(softmax, "axis", -1)
    if axis != -1 and axis != (rank(probs) or 0) - 1:
        return None
    scale = 1.0
    if s is not None:
        scale = scalar(s)
    elif d is not None:
        divisor = scalar(d)
        scale = None if not divisor else 1.0 / divisor
    if scale is None:
        return None
    perm_attr = kt.producer().attributes.get("perm")
    src_rank = rank(kt_src)
    if src_rank is None or src_rank < 2:
        return None
    perm = list(perm_attr.as_ints()) if perm_attr is not None else list(reversed(range(src_rank)))
    # K = transpose(kt_src, perm) with its last two axes swapped back.
    k_perm = perm[:-2] + [perm[-1], perm[-2]]
    k = kt_src if k_perm == list(range(src_rank)) else op.Transpose(kt_src, perm=k_perm)
    inputs = [q, k, v] + ([mask] if mask is not None else [])
    return op.ScaledDotProductAttention(*inputs, scale=float(scale), _domain=EDGEBUILD_DOMAIN)


RULES = [
    # Longest first: the scaled-and-masked form would otherwise be missed for a shorter one.
    pattern.RewriteRule(_scaled_mul_masked, _sdpa, name="sdpa_scale_mask"),
    pattern.RewriteRule(_scaled_div_masked, _sdpa, name="sdpa_div_mask"),
    pattern.RewriteRule(_scaled_mul, _sdpa, name="sdpa_scale"),
    pattern.RewriteRule(_scaled_div, _sdpa, name="sdpa_div"),
    pattern.RewriteRule(_masked, _sdpa, name="sdpa_mask"),
    pattern.RewriteRule(_plain, _sdpa, name="sdpa"),
]
