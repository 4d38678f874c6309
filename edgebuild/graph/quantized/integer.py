"""Integer-exact quantised products in float ops: the bounds, the power-of-two shift, the chunks.

onnxruntime's integer kernels sum ``(x_q - x_zp) * (w_q - w_zp)`` in int32 and scale the sum
once. The same sum taken in float32 over integer-valued operands is exact, in any summation
order, while every partial sum stays below 2**24; the decomposition passes emit it so, and the
one scale multiply after it rounds as onnxruntime's does.

Two bounds decide the form, both from the operands' worst case (the weight's values are known,
a run-time 8-bit operand is at most 255 away from its zero point):

- **exactness**: where a contraction could pass 2**24, it is split into chunks that cannot, and
  the chunk results are added: each chunk is exact; their sum is exact while the running total
  stays below 2**24 (it rounds once per chunk beyond, as int32 -> float would once);
- **fp16 headroom**: one precision-independent graph serves fp32 and fp16 builds, and an fp16
  sum cannot hold integers beyond 65504. The weight's integers are stored times ``2**-shift``
  (exact: a power of two) so the worst-case sum stays below 2**15, and the scale after the sum
  is multiplied by ``2**shift`` (exact too): at fp32 the result is bit for bit the unshifted one.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

EXACT_LIMIT = 2**24  # float32 holds every integer up to here
FP16_HEADROOM = 2**15  # a shifted worst-case sum stays below this (fp16's largest finite is 65504)
EIGHT_BIT_SPAN = 255  # |q - zero point| of an 8-bit value whose zero point has its type


def centred(data: np.ndarray, zero: np.ndarray | None, channel_axis: int) -> np.ndarray:
    """|data - zero point| as int64, a per-channel zero point broadcast along ``channel_axis``."""
    values = data.astype(np.int64)
    if zero is not None and np.size(zero) > 1:
        view = [1] * data.ndim
        view[channel_axis] = -1
        values = values - np.asarray(zero, np.int64).reshape(view)
    elif zero is not None:
        values = values - int(np.asarray(zero).reshape(()))
    return np.abs(values)


def contraction_sums(weight: np.ndarray, zero: np.ndarray | None, conv: bool) -> np.ndarray:
    """Per contraction index (MatMul: B's row k; Conv: input channel c), the largest sum over one
    output channel of |w - zero point|: what one step of the contraction can add to any sum."""
    if conv:  # [M, C/group, k...], zero point per output channel M
        per_output = centred(weight, zero, 0).reshape(weight.shape[0], weight.shape[1], -1).sum(axis=2)
        return per_output.max(axis=0)  # [C/group]
    # [..., K, N], zero point per column N
    values = centred(weight, zero, weight.ndim - 1)
    return np.moveaxis(values, -2, 0).reshape(values.shape[-2], -1).max(axis=1)


def shift_for(bound: float) -> int:
    """The power of two taken off a weight so that a sum of worst case ``bound`` fits fp16."""
    if bound <= FP16_HEADROOM:
        return 0
    return max(0, math.ceil(math.log2(bound / FP16_HEADROOM)))


def chunks(steps: np.ndarray, other_max: int) -> list[tuple[int, int]]:
    """Split ``range(len(steps))`` into runs whose worst-case sum (``other_max`` times the sum of
    ``steps``) stays below 2**24; one run when the whole contraction does."""
    runs, start, total = [], 0, 0
    for k, step in enumerate(steps.tolist()):
        add = other_max * int(step)
        if k > start and total + add >= EXACT_LIMIT:
            runs.append((start, k))
            start, total = k, 0
        total += add
    runs.append((start, len(steps)))
    return runs


def chunked_product(op: Callable, const: Callable, kind: str, a, weight_part: Callable, runs, axis: int,
                    attributes: dict, bias=None):
    """``kind`` (MatMul or Conv) of ``a`` and the weight, split over the contraction ``runs``.

    ``op(op_type, inputs, attributes) -> value`` and ``const(array) -> value`` build nodes;
    ``weight_part(start, end) -> value`` is the integer-valued weight's slice; ``axis``: a's
    contraction axis. ``bias`` (Conv's, integer-valued) joins the first chunk.
    """
    parts = []
    for start, end in runs:
        x = a
        if len(runs) > 1:
            x = op("Slice", [a, const(np.array([start], np.int64)), const(np.array([end], np.int64)),
                             const(np.array([axis], np.int64))], {})
        inputs = [x, weight_part(start, end)] + ([bias] if bias is not None and not parts else [])
        parts.append(op(kind, inputs, attributes))
    total = parts[0]
    for part in parts[1:]:
        total = op("Add", [total, part], {})
    return total
