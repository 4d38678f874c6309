"""Det: the determinant of square matrices in the last two axes.

MIL has no determinant. 1x1 and 2x2 matrices use the closed form; larger ones an LU
factorisation with partial pivoting unrolled over the (static) size n, as LAPACK's getrf
computes it: at step k the row with the largest |A[i, k]| (i >= k) is swapped up (flipping the
sign), the rows below are eliminated, and the pivots multiply into the determinant. A zero pivot
makes the determinant 0 (the division it would cause is skipped).
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import (
    dtype_of,
    is_static,
    rank_of,
    select,
    shape_of,
)
from edgebuild_coreml.lowering.registry import lowers

_MAX_UNROLLED = 64  # the unrolled elimination grows as n**2 ops


def _part(ctx, node, a, rows, cols, tag):
    """``a[:, rows, cols]`` for a batch of matrices; ``rows``/``cols`` are (start, stop) pairs."""
    return mb.slice_by_index(x=a, begin=[0, rows[0], cols[0]], end=[0, rows[1], cols[1]],
                             end_mask=[True, False, False], name=ctx.name(node, tag))


def _entry(ctx, node, a, i, j, tag):
    """``a[:, i, j]`` as a [B] vector."""
    return mb.reshape(x=_part(ctx, node, a, (i, i + 1), (j, j + 1), tag + "_1"), shape=[-1], name=ctx.name(node, tag))


def _swap_pivot_row_up(ctx, node, a, k: int, n: int):
    """``a`` with row k swapped for the row (>= k) whose column-k entry is largest in magnitude,
    and the sign (+1/-1 per matrix) of that swap."""
    column = mb.abs(x=_part(ctx, node, a, (k, n), (k, k + 1), f"col{k}"), name=ctx.name(node, f"abs{k}"))
    offset = mb.reduce_argmax(x=column, axis=1, keep_dims=False, name=ctx.name(node, f"argmax{k}"))  # [B, 1]
    pivot_row = mb.add(x=offset, y=np.int32(k), name=ctx.name(node, f"pivot_row{k}"))
    rows = np.arange(n, dtype=np.int32)[None, :]
    others = select(mb.equal(x=rows, y=pivot_row), np.int32(k), rows, name=ctx.name(node, f"others{k}"))  # [B, n]
    order = select(np.equal(rows, k), pivot_row, others, name=ctx.name(node, f"order{k}"))
    indices = mb.tile(x=mb.expand_dims(x=order, axes=[-1]), reps=[1, 1, n], name=ctx.name(node, f"rows{k}"))
    swapped = mb.gather_along_axis(x=a, indices=indices, axis=1, name=ctx.name(node, f"pivoted{k}"))
    moved = mb.not_equal(x=mb.reshape(x=offset, shape=[-1]), y=np.int32(0), name=ctx.name(node, f"moved{k}"))
    sign = select(moved, np.float32(-1), np.float32(1), name=ctx.name(node, f"sign{k}"))
    return swapped, sign


def _lu_determinant(ctx, node, a, n: int):
    det = None
    for k in range(n):
        if k < n - 1:
            a, sign = _swap_pivot_row_up(ctx, node, a, k, n)
            det = sign if det is None else mb.mul(x=det, y=sign, name=ctx.name(node, f"signed{k}"))
        pivot = _entry(ctx, node, a, k, k, f"pivot{k}")
        det = pivot if det is None else mb.mul(x=det, y=pivot, name=ctx.name(node, f"product{k}"))
        if k == n - 1:
            break
        safe = select(mb.equal(x=pivot, y=np.float32(0)), np.float32(1), pivot, name=ctx.name(node, f"safe_pivot{k}"))
        below = _part(ctx, node, a, (k + 1, n), (k, k + 1), f"below{k}")  # [B, n-k-1, 1]
        factors = mb.real_div(x=below, y=mb.reshape(x=safe, shape=[-1, 1, 1]), name=ctx.name(node, f"factors{k}"))
        row = _part(ctx, node, a, (k, k + 1), (0, n), f"row{k}")  # [B, 1, n]
        lower = mb.sub(x=_part(ctx, node, a, (k + 1, n), (0, n), f"lower{k}"),
                       y=mb.mul(x=factors, y=row, name=ctx.name(node, f"update{k}")), name=ctx.name(node, f"eliminated{k}"))
        a = mb.concat(values=[_part(ctx, node, a, (0, k + 1), (0, n), f"upper{k}"), lower], axis=1,
                      name=ctx.name(node, f"step{k}"))
    return det


@lowers("Det", since=11)
def det(ctx, node):
    x = ctx.input(node, 0)
    if dtype_of(x) not in ("fp32", "fp16"):
        ctx.fail(node, "Det needs a floating-point input")
    shape = shape_of(x)
    if rank_of(x) < 2 or not (is_static(shape[-1]) and is_static(shape[-2])) or shape[-1] != shape[-2]:
        ctx.fail(node, f"needs square matrices of a size known when the model is built in the last two axes, "
                 f"not shape {tuple(shape)}", "pin the input shapes in the recipe")
    n = int(shape[-1])
    if n > _MAX_UNROLLED:
        ctx.fail(node, f"{n}x{n} matrices are too large for the unrolled elimination (at most {_MAX_UNROLLED})")
    half = dtype_of(x) == "fp16"  # eliminate in fp32, give back fp16
    if half:
        x = mb.cast(x=x, dtype="fp32", name=ctx.name(node, "fp32"))
    a = mb.reshape(x=x, shape=[-1, n, n], name=ctx.name(node, "batch"))
    if n == 1:
        result = _entry(ctx, node, a, 0, 0, "only")
    elif n == 2:
        result = mb.sub(x=mb.mul(x=_entry(ctx, node, a, 0, 0, "a"), y=_entry(ctx, node, a, 1, 1, "d")),
                        y=mb.mul(x=_entry(ctx, node, a, 0, 1, "b"), y=_entry(ctx, node, a, 1, 0, "c")),
                        name=ctx.name(node, "closed_form"))
    else:
        result = _lu_determinant(ctx, node, a, n)
    batch = shape[:-2]
    if all(is_static(d) for d in batch):
        out_shape = np.array(batch, dtype=np.int32)
    else:
        out_shape = mb.slice_by_index(x=mb.shape(x=x), begin=[0], end=[len(batch)], name=ctx.name(node, "batch_shape"))
    out = mb.reshape(x=result, shape=out_shape, name=ctx.name(node, "fp32_det" if half else ""))
    return mb.cast(x=out, dtype="fp16", name=ctx.name(node)) if half else out
