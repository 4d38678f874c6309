"""Grouped-query attention: drop the repeat_kv copies in front of fused attention.

Decoders with fewer key/value heads than query heads (Llama, Qwen2, Phi-3, Gemma) repeat each
K/V head for its group of query heads before attending (``repeat_kv``), exported as::

    Reshape(Expand(Unsqueeze(k, 2), [B, Hkv, G, T, D]), [B, Hkv * G, T, D])

The rule hands the shared heads to ``edgebuild::ScaledDotProductAttention`` directly (the op
lets query head ``h`` use K/V head ``h // G``), so no backend materialises the repeated K/V.
It runs after ``fuse_attention``, which produced the op.

Attention the fused op does not cover (Gemma-2 soft-caps its logits with a tanh) keeps its
explicit MatMuls; there the repeat goes too, the query heads are grouped instead:
``MatMul(a, [Transpose](repeat(kv)))`` with ``a`` (B, H, S, X) becomes
``Reshape(MatMul(Reshape(a, (B, Hkv, G*S, X)), [Transpose](kv)), (B, H, S, Y))`` — plain ONNX,
each K/V head multiplied once by the rows of all its query heads. Whatever sits between the two
MatMuls (scaling, Gemma-2's ``tanh`` soft-capping, the mask, the softmax) is elementwise or per
row, so it is left as it is.
"""

from __future__ import annotations

from onnxscript.rewriter import pattern

from edgebuild.graph.fusion_rules._values import (
    EDGEBUILD_DOMAIN,
    const_array,
    float_attr,
)


def _repeated(op, kv, axes, expanded_shape, shape):
    return op.Reshape(op.Expand(op.Unsqueeze(kv, axes), expanded_shape), shape, _allow_other_attributes=True)


def _target(masked: bool):
    def target(op, q, k, v, k_axes, k_expand, k_shape, v_axes, v_expand, v_shape, mask):
        inputs = [q, _repeated(op, k, k_axes, k_expand, k_shape), _repeated(op, v, v_axes, v_expand, v_shape)]
        if masked:
            inputs.append(mask)
        return op.ScaledDotProductAttention(*inputs, _domain=EDGEBUILD_DOMAIN, _outputs=["attended"])

    return target


def _shape_entries(value) -> list[int | None] | None:
    """A shape operand's entries: all of a constant, or those of a Concat of one-element pieces
    with the computed ones (a KV cache's dynamic batch and length) as None."""
    array = const_array(value)
    if array is not None:
        return [int(d) for d in array.reshape(-1)]
    node = value.producer()
    if node is None or node.op_type != "Concat":
        return None
    entries = []
    for piece in node.inputs:
        part = const_array(piece)
        if part is not None:
            entries += [int(d) for d in part.reshape(-1)]
        elif piece.shape is not None and list(piece.shape) == [1]:
            entries.append(None)
        else:
            return None
    return entries


def _repeats(kv, axes, expanded_shape, shape, q_heads: int) -> bool:
    """Whether the chain repeats each of ``kv``'s (B, Hkv, T, D) heads ``q_heads / Hkv`` times in a row."""
    if kv.shape is None or len(kv.shape) != 4 or not isinstance(kv.shape[1], int):
        return False
    kv_heads = kv.shape[1]
    if q_heads % kv_heads:
        return False
    axes_value = const_array(axes)
    expanded, target = _shape_entries(expanded_shape), _shape_entries(shape)
    if axes_value is None or expanded is None or target is None:
        return False
    if [int(a) for a in axes_value.reshape(-1)] not in ([2], [-3]):
        return False
    group = q_heads // kv_heads
    return (len(expanded) == 5 and expanded[1] in (1, kv_heads) and expanded[2] == group
            and len(target) == 4 and target[1] == q_heads)


def _replacement(masked: bool):
    def replacement(op, q, k, v, k_axes, k_expand, k_shape, v_axes, v_expand, v_shape, attended, mask=None):
        if q.shape is None or len(q.shape) != 4 or not isinstance(q.shape[1], int):
            return None
        heads = q.shape[1]
        if not (_repeats(k, k_axes, k_expand, k_shape, heads) and _repeats(v, v_axes, v_expand, v_shape, heads)):
            return None
        if k.shape[1] != v.shape[1]:
            return None
        scale = float_attr(attended.producer(), "scale", 1.0)
        inputs = [q, k, v] + ([mask] if masked else [])
        # The head counts ride along: with dynamic lengths a backend may no longer infer them.
        return op.ScaledDotProductAttention(*inputs, scale=scale, q_heads=heads, kv_heads=k.shape[1],
                                            _domain=EDGEBUILD_DOMAIN)

    return replacement


def _matmul_target(transposed: bool):
    def target(op, a, kv, axes, expanded_shape, shape):
        repeated = _repeated(op, kv, axes, expanded_shape, shape)
        if transposed:
            repeated = op.Transpose(repeated, _allow_other_attributes=True, _outputs=["swapped"])
        return op.MatMul(a, repeated)

    return target


def _matmul_replacement(transposed: bool):
    def replacement(op, a, kv, axes, expanded_shape, shape, swapped=None):
        if a.shape is None or len(a.shape) != 4 or not isinstance(a.shape[1], int):
            return None
        heads = a.shape[1]
        if not _repeats(kv, axes, expanded_shape, shape, heads):
            return None
        kv_heads = kv.shape[1]
        if transposed:
            perm = swapped.producer().attributes.get("perm")
            if perm is None or list(perm.as_ints()) != [0, 1, 3, 2]:
                return None
            kv = op.Transpose(kv, perm=[0, 1, 3, 2])
        # 0 keeps the batch and the last axis as they are, -1 takes the rows of the whole group:
        # the lengths may be dynamic (a KV cache), only the head counts need be known.
        grouped = op.Reshape(a, op.Constant(value_ints=[0, kv_heads, -1, 0]))
        return op.Reshape(op.MatMul(grouped, kv), op.Constant(value_ints=[0, heads, -1, 0]))

    return replacement


def rules() -> list[pattern.RewriteRule]:
    return [
        pattern.RewriteRule(_target(masked), _replacement(masked), name=f"grouped_query{'_mask' * masked}")
        for masked in (True, False)
    ] + [
        pattern.RewriteRule(_matmul_target(transposed), _matmul_replacement(transposed),
                            name=f"grouped_query_matmul{'_transposed' * transposed}")
        for transposed in (True, False)
    ]
