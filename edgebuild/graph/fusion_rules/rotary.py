"""Rotary position embeddings written out -> ONNX ``RotaryEmbedding`` (opset 23).

Half-split (Llama, Qwen2, Phi-3, Gemma: ``rotate_half``)::

    x * cos + Concat(-x[..., h:], x[..., :h]) * sin

Interleaved (GPT-J style pairs: ``rotate_every_two``)::

    x * cos + Reshape(Concat(Unsqueeze(-x[..., 1::2], -1), Unsqueeze(x[..., 0::2], -1))) * sin

``x`` is (B, H, S, D) and ``cos``/``sin`` broadcast as (B|1, 1, S, D), or (GPT-J) ``x`` is
(B, S, H, D) and the tables (B|1, S, 1, D). Each angle's cosine is repeated over its channel
pair (twice in a row for half-split, ``Concat(c, c)``; pairwise when interleaved). The op wants
each angle once, (B, S, D/2): a constant table is checked to repeat and cut; a computed one must
visibly be ``Unsqueeze(f(Concat(a, a)))`` with ``f`` elementwise (half-split), or torch's
``repeat_interleave(a, 2)`` (interleaved).
onnxscript's own rotary rule only accepts the cosine computed from ``Concat(freqs, freqs)``,
which constant folding has already erased when positions are static, hence these rules.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from edgebuild.graph.fusion_rules._values import (
    const_array,
    int_attr,
    new_initializer,
    rank,
)

MIN_OPSET = 23
# Ops that act on each element alone: a repeated table stays repeated through them.
_ELEMENTWISE = {"Cos", "Sin", "Cast", "Mul", "Div", "Identity"}


def _half_split(op, x, cos, sin, s0, e0, s1, e1, a0, a1, st0, st1):
    first = op.Slice(x, s0, e0, a0, st0)
    second = op.Slice(x, s1, e1, a1, st1)
    rotated = op.Concat(op.Neg(second), first, axis=-1)
    return op.Add(op.Mul(x, cos), op.Mul(rotated, sin))


def _interleaved(op, x, cos, sin, s0, e0, s1, e1, a0, a1, st0, st1, u0, u1, shape):
    even = op.Slice(x, s0, e0, a0, st0)
    odd = op.Slice(x, s1, e1, a1, st1)
    pairs = op.Concat(op.Unsqueeze(op.Neg(odd), u0), op.Unsqueeze(even, u1), axis=-1)
    return op.Add(op.Mul(x, cos), op.Mul(op.Reshape(pairs, shape, _allow_other_attributes=True), sin))


def _ints(value) -> list[int] | None:
    array = const_array(value)
    return None if array is None else [int(a) for a in array.reshape(-1)]


def _last_axis_slice(x_rank: int, start, end, axes, steps, want_start: int, want_end: int, step: int) -> bool:
    got = [_ints(v) for v in (start, end, axes, steps)]
    if any(g is None or len(g) != 1 for g in got):
        return False
    (b,), (e,), (axis,), (s,) = got
    return axis in (-1, x_rank - 1) and b == want_start and s == step and (e == want_end or e >= 2 ** 62)


# Where the broadcast head axis sits in a cos/sin table: (B|1, 1, S, D) for x as (B, H, S, D);
# (B|1, S, 1, D) for x as (B, S, H, D), GPT-J's layout while it rotates.
HEAD_AXIS = {"bhsd": 1, "bshd": 2}


def _table(op, value: ir.Value, head_size: int, interleaved: bool, batch: int | None, hint: ir.Value,
           suffix: str) -> tuple[ir.Value, str] | None:
    """One row per angle, (B, S, D/2), and the layout, from a broadcast cos/sin table, or None."""
    array = const_array(value)
    if array is not None:
        if batch is None or array.ndim != 4 or array.shape[-1] != head_size or 1 not in array.shape[1:3]:
            return None
        layout = "bhsd" if array.shape[1] == 1 else "bshd"
        first, second = (array[..., 0::2], array[..., 1::2]) if interleaved else np.split(array, 2, axis=-1)
        if not np.array_equal(first, second):
            return None
        rows = np.squeeze(first, axis=HEAD_AXIS[layout])
        table = np.broadcast_to(rows, (batch,) + rows.shape[1:])
        # named after the rotated value: one table per use keeps names unique
        return new_initializer(op, np.ascontiguousarray(table.astype(array.dtype)), hint, suffix), layout
    producer = value.producer()
    if interleaved:
        return _repeated_pairs(value)
    if producer is None or producer.op_type != "Unsqueeze":
        return None
    layout = {1: "bhsd", -3: "bhsd", 2: "bshd", -2: "bshd"}.get((_ints(producer.inputs[1]) or [None])[0])
    full = producer.inputs[0]
    if layout is None or len(_ints(producer.inputs[1])) != 1 or rank(full) != 3 or not _repeats_halves(full):
        return None
    half = head_size // 2
    return op.Slice(full, op.Constant(value_ints=[0]), op.Constant(value_ints=[half]),
                    op.Constant(value_ints=[-1])), layout


def _repeated_pairs(value: ir.Value) -> tuple[ir.Value, str] | None:
    """``a`` (B, S, D/2) from ``repeat_interleave(a, 2, -1)`` with a head axis inserted, as torch
    writes it: ``Reshape(Expand(Unsqueeze(a, [h, 4]), [1, 1, 1, 1, 2]), (B, S, 1, D) or (B, 1, S, D))``."""
    reshape = value.producer()
    if reshape is None or reshape.op_type != "Reshape":
        return None
    expand = reshape.inputs[0].producer()
    if expand is None or expand.op_type != "Expand" or _ints(expand.inputs[1]) != [1, 1, 1, 1, 2]:
        return None
    unsqueeze = expand.inputs[0].producer()
    if unsqueeze is None or unsqueeze.op_type != "Unsqueeze" or rank(unsqueeze.inputs[0]) != 3:
        return None
    layout = {(1, 4): "bhsd", (2, 4): "bshd"}.get(tuple(_ints(unsqueeze.inputs[1]) or ()))
    target = _ints(reshape.inputs[1])
    if layout is None or target is None or len(target) != 4 or target[HEAD_AXIS[layout]] != 1:
        return None
    return unsqueeze.inputs[0], layout


def _repeats_halves(value: ir.Value) -> bool:
    """Whether ``value`` is elementwise(Concat(a, a, axis=-1)), scalar operands only."""
    node = value.producer()
    while node is not None and node.op_type in _ELEMENTWISE:
        for other in node.inputs[1:]:
            array = const_array(other)
            if array is None or array.size != 1:
                return False
        node = node.inputs[0].producer()
    return (node is not None and node.op_type == "Concat" and len(node.inputs) == 2
            and node.inputs[0] is node.inputs[1] and int_attr(node, "axis", 0) in (-1, rank(node.inputs[0]) - 1))


def _replacement(interleaved: bool):
    def replacement(op, x, cos, sin, s0, e0, s1, e1, a0, a1, st0, st1, u0=None, u1=None, shape=None):
        if x.shape is None or len(x.shape) != 4 or not isinstance(x.shape[3], int):
            return None
        # a decoder's batch is dynamic: only a constant table (repeated over the batch) needs it
        batch, head_size = (x.shape[0] if isinstance(x.shape[0], int) else None), x.shape[3]
        if head_size % 2:
            return None
        half = head_size // 2
        if interleaved:
            if not (_last_axis_slice(4, s0, e0, a0, st0, 0, head_size, 2)
                    and _last_axis_slice(4, s1, e1, a1, st1, 1, head_size, 2)):
                return None
            if _ints(u0) not in ([-1], [4]) or _ints(u1) not in ([-1], [4]) or _ints(shape) is None:
                return None
            target = _ints(shape)
            if len(target) != 4 or target[-1] not in (-1, head_size):
                return None
        elif not (_last_axis_slice(4, s0, e0, a0, st0, 0, half, 1)
                  and _last_axis_slice(4, s1, e1, a1, st1, half, head_size, 1)):
            return None
        cos_table = _table(op, cos, head_size, interleaved, batch, x, "rotary_cos")
        sin_table = _table(op, sin, head_size, interleaved, batch, x, "rotary_sin")
        if cos_table is None or sin_table is None or cos_table[1] != sin_table[1]:
            return None
        (cos_rows, layout), (sin_rows, _) = cos_table, sin_table
        if layout == "bhsd":
            return op.RotaryEmbedding(x, cos_rows, sin_rows, interleaved=int(interleaved))
        # The op rotates (B, H, S, D); the transposes around it cancel against the attention's own.
        heads_first = op.Transpose(x, perm=[0, 2, 1, 3])
        rotated = op.RotaryEmbedding(heads_first, cos_rows, sin_rows, interleaved=int(interleaved))
        return op.Transpose(rotated, perm=[0, 2, 1, 3])

    return replacement


def _partial(op, x, cos, sin, s0, e0, a0, st0, s1, e1, a1, st1):
    """Partial rotary (GPT-NeoX, Phi-2, StableLM: ``partial_rotary_factor``): the first R channels
    of each head rotated, the rest passed through, once the rules above fused the rotated part."""
    rotated = op.RotaryEmbedding(op.Slice(x, s0, e0, a0, st0), cos, sin, _allow_other_attributes=True,
                                 _outputs=["rotated"])
    return op.Concat(rotated, op.Slice(x, s1, e1, a1, st1), axis=-1)


def _partial_replacement(op, x, cos, sin, s0, e0, a0, st0, s1, e1, a1, st1, rotated):
    node = rotated.producer()
    if x.shape is None or len(x.shape) != 4 or not isinstance(x.shape[3], int):
        return None
    if int_attr(node, "rotary_embedding_dim", 0) or int_attr(node, "num_heads", 0) or len(node.inputs) > 3:
        return None
    cut = (_ints(e0) or [0])[0]
    if not (0 < cut < x.shape[3] and _last_axis_slice(4, s0, e0, a0, st0, 0, cut, 1)
            and _last_axis_slice(4, s1, e1, a1, st1, cut, x.shape[3], 1)):
        return None
    return op.RotaryEmbedding(x, cos, sin, interleaved=int_attr(node, "interleaved", 0), rotary_embedding_dim=cut)


def rules() -> list[pattern.RewriteRule]:
    return [
        pattern.RewriteRule(_interleaved, _replacement(True), name="rotary_interleaved"),
        pattern.RewriteRule(_half_split, _replacement(False), name="rotary_half_split"),
        pattern.RewriteRule(_partial, _partial_replacement, name="rotary_partial"),
    ]
