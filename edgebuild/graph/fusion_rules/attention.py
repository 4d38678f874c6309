"""Attention written out -> ``edgebuild::ScaledDotProductAttention(Q, K, V, mask?, scale)``.

Matches ``Softmax(MatMul(Q, Transpose(K')) [* s | / s] [+ mask]) @ V``, plus torch's
spelling ``MatMul(Q * sqrt(s), Transpose(K') * sqrt(s))`` and its NaN guard
``Where(IsNaN(p), 0, p)``. The guard is dropped: it only differs for a query whose every key
is masked with -inf, which padding masks do not produce. The fused op takes
K as ``[..., Lk, D]``: when the Transpose does more than swap the last two axes (exporters
often fold the head split into it, e.g. perm [0, 2, 3, 1]) the remaining permutation is
kept as a Transpose in front of K.
"""

from __future__ import annotations

from onnxscript.rewriter import pattern

from edgebuild.graph.fusion_rules._values import (
    EDGEBUILD_DOMAIN,
    int_attr,
    rank,
    scalar,
)

SCALE_FORMS = ("split", "mul", "div", "none")  # longest first


def _target(scale_form: str, masked: bool, nan_guard: bool):
    """A pattern for one combination of scale spelling, mask and NaN guard.

    ``split`` is how torch's exporter writes SDPA: sqrt(scale) applied to Q and to K^T.
    The NaN guard ``Where(IsNaN(p), 0, p)`` zeroes rows whose keys are all masked.
    """

    def target(op, q, kt, v, s, s2, mask, zero):
        if scale_form == "split":
            scores = op.MatMul(op.Mul(q, s), op.Mul(kt, s2))
        else:
            scores = op.MatMul(q, kt)
            if scale_form == "mul":
                scores = op.Mul(scores, s)
            elif scale_form == "div":
                scores = op.Div(scores, s)
        if masked:
            scores = op.Add(scores, mask)
        probs = op.Softmax(scores, _outputs=["probs"])
        if nan_guard:
            probs = op.Where(op.IsNaN(probs), zero, probs)
        return op.MatMul(probs, v)

    return target


def _replacement(scale_form: str):
    def replacement(op, q, kt, v, probs, s=None, s2=None, mask=None, zero=None):
        if zero is not None and scalar(zero) != 0.0:
            return None
        if scale_form == "none":
            scale = 1.0
        elif scale_form == "mul":
            scale = scalar(s)
        elif scale_form == "div":
            divisor = scalar(s)
            scale = 1.0 / divisor if divisor else None
        else:
            a, b = scalar(s), scalar(s2)
            scale = None if a is None or b is None else a * b
        if scale is None:
            return None
        return _sdpa(op, q, kt, v, probs, scale, mask)

    return replacement


def _untransposed_key(op, kt):
    """K in [..., Lk, D] from K^T: undo a producing Transpose, else add one."""
    producer = kt.producer()
    if producer is not None and producer.op_type == "Transpose" and producer.domain in ("", "ai.onnx"):
        src = producer.inputs[0]
        src_rank = rank(src)
        perm_attr = producer.attributes.get("perm")
        if src_rank is None or src_rank < 2:
            return None
        perm = list(perm_attr.as_ints()) if perm_attr is not None else list(reversed(range(src_rank)))
        k_perm = perm[:-2] + [perm[-1], perm[-2]]
        # The old Transpose becomes dead if nothing else reads it; the pass sweeps it away.
        return src if k_perm == list(range(src_rank)) else op.Transpose(src, perm=k_perm)
    kt_rank = rank(kt)
    if kt_rank is None or kt_rank < 2:
        return None
    return op.Transpose(kt, perm=list(range(kt_rank - 2)) + [kt_rank - 1, kt_rank - 2])


def _sdpa(op, q, kt, v, probs, scale: float, mask):
    axis = int_attr(probs.producer(), "axis", -1)
    if axis != -1 and axis != (rank(probs) or 0) - 1:
        return None
    k = _untransposed_key(op, kt)
    if k is None:
        return None
    inputs = [q, k, v] + ([mask] if mask is not None else [])
    return op.ScaledDotProductAttention(*inputs, scale=float(scale), _domain=EDGEBUILD_DOMAIN)


def rules() -> list[pattern.RewriteRule]:
    return [
        pattern.RewriteRule(_target(form, masked, guard), _replacement(form), name=f"sdpa_{form}{'_mask' * masked}{'_guard' * guard}")
        # Longest first, so a scaled, masked attention is not claimed by a shorter pattern.
        for guard in (True, False)
        for masked in (True, False)
        for form in SCALE_FORMS
    ]
