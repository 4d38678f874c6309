"""Einsum with one or two operands, as gathers, reductions, transposes and one batched matmul.

MIL's own einsum takes only a few fixed equations, so the general case is rewritten:
ellipses become fresh letters (right-aligned, numpy-style), repeated letters in one term take
the diagonal, operand-only letters are summed out, then A -> [batch, left, contracted],
B -> [batch, contracted, right], a matmul, and a reshape/transpose into the output's order.
Needs static shapes.
"""

from __future__ import annotations

import string

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import is_static, shape_of
from edgebuild_coreml.lowering.registry import lowers


def _expand_ellipses(ctx, node, terms: list[str], rhs: str | None, ranks: list[int]):
    """Terms with ``...`` replaced by letters unused in the equation; broadcast dims align right."""
    used = set("".join(terms) + (rhs or ""))
    spare = [c for c in string.ascii_uppercase + string.ascii_lowercase if c not in used]
    widest = 0
    for term, rank in zip(terms, ranks):
        if "..." in term:
            widest = max(widest, rank - (len(term) - 3))
        elif len(term) != rank:
            ctx.fail(node, f"term {term!r} has {len(term)} letters for a rank-{rank} operand")
    if widest > len(spare):
        ctx.fail(node, "the ellipsis spans more dimensions than there are spare letters")
    letters = "".join(spare[:widest])
    expanded = []
    for term, rank in zip(terms, ranks):
        if "..." in term:
            count = rank - (len(term) - 3)
            if count < 0:
                ctx.fail(node, f"term {term!r} has more letters than its rank-{rank} operand has dims")
            term = term.replace("...", letters[widest - count:])
        expanded.append(term)
    if rhs is not None and "..." in rhs:
        rhs = rhs.replace("...", letters)
    return expanded, rhs, letters


def _parse(ctx, node, equation: str, ranks: list[int]):
    equation = equation.replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks) or len(ranks) not in (1, 2):
        ctx.fail(node, f"equation {equation!r}: only one or two operands are supported")
    terms, rhs, broadcast = _expand_ellipses(ctx, node, terms, rhs if arrow else None, ranks)
    if not arrow:  # implicit output: broadcast dims, then letters used once, alphabetically
        joined = "".join(terms)
        rhs = broadcast + "".join(c for c in sorted(set(joined) - set(broadcast)) if joined.count(c) == 1)
    if len(set(rhs)) != len(rhs):
        ctx.fail(node, f"equation {equation!r}: a letter repeats in the output")
    if any(c not in "".join(terms) for c in rhs):
        ctx.fail(node, f"equation {equation!r}: an output letter appears in no operand")
    return terms, rhs


def _take_diagonals(ctx, node, x, term: str):
    """Collapse letters repeated within one term to their diagonal (``ii -> i``)."""
    while len(set(term)) != len(term):
        letter = next(c for c in term if term.count(c) > 1)
        first, second = [i for i, c in enumerate(term) if c == letter][:2]
        size = int(shape_of(x)[first])
        rest = [i for i in range(len(term)) if i not in (first, second)]
        moved = mb.transpose(x=x, perm=rest + [first, second], name=ctx.name(node, "diag_in"))
        kept = [int(shape_of(x)[i]) for i in rest]
        flat = mb.reshape(x=moved, shape=np.array(kept + [size * size], np.int32), name=ctx.name(node, "diag_flat"))
        x = mb.gather(x=flat, indices=np.arange(size, dtype=np.int32) * (size + 1), axis=len(kept),
                      name=ctx.name(node, "diag"))
        term = "".join(term[i] for i in rest) + letter
    return x, term


def _sum_out(ctx, node, x, term: str, keep: str):
    """Sum the axes of ``x`` whose letters are not in ``keep``."""
    axes = [i for i, c in enumerate(term) if c not in keep]
    if axes:
        x = mb.reduce_sum(x=x, axes=axes, keep_dims=False, name=ctx.name(node, "sum_out"))
    return x, "".join(c for c in term if c in keep)


def _permute(ctx, node, x, term: str, order: str):
    if term == order:
        return x
    return mb.transpose(x=x, perm=[term.index(c) for c in order], name=ctx.name(node, "permute"))


def _shape(dims) -> np.ndarray:
    return np.array([int(d) for d in dims], dtype=np.int32)


@lowers("Einsum", since=12)
def einsum(ctx, node):
    operands = [ctx.input(node, i) for i in range(len(node.inputs))]
    shapes = [shape_of(x) for x in operands]
    if not all(is_static(d) for shape in shapes for d in shape):
        ctx.fail(node, "needs static input shapes", hint="pin the input shapes in the recipe")
    terms, out = _parse(ctx, node, ctx.attr(node, "equation"), [len(s) for s in shapes])
    diagonal = [_take_diagonals(ctx, node, x, t) for x, t in zip(operands, terms)]
    operands, terms = [d[0] for d in diagonal], [d[1] for d in diagonal]
    sizes: dict[str, int] = {}
    for x, term in zip(operands, terms):
        for c, d in zip(term, shape_of(x)):
            sizes[c] = max(sizes.get(c, 1), int(d))
    if len(operands) == 1:
        x, term = _sum_out(ctx, node, operands[0], terms[0], out)
        return mb.identity(x=_permute(ctx, node, x, term, out), name=ctx.name(node))

    (a, b), (ta, tb) = operands, terms
    a, ta = _sum_out(ctx, node, a, ta, tb + out)
    b, tb = _sum_out(ctx, node, b, tb, ta + out)
    batch = "".join(c for c in ta if c in tb and c in out)
    contracted = "".join(c for c in ta if c in tb and c not in out)
    left = "".join(c for c in ta if c not in tb)
    right = "".join(c for c in tb if c not in ta)
    flat = lambda letters: int(np.prod([sizes[c] for c in letters], dtype=np.int64))  # noqa: E731
    # Each operand keeps its own batch sizes: size-1 dims broadcast in matmul, as in ONNX.
    a_batch = [int(shape_of(a)[ta.index(c)]) for c in batch]
    b_batch = [int(shape_of(b)[tb.index(c)]) for c in batch]
    a = mb.reshape(x=_permute(ctx, node, a, ta, batch + left + contracted),
                   shape=_shape(a_batch + [flat(left), flat(contracted)]), name=ctx.name(node, "lhs"))
    b = mb.reshape(x=_permute(ctx, node, b, tb, batch + contracted + right),
                   shape=_shape(b_batch + [flat(contracted), flat(right)]), name=ctx.name(node, "rhs"))
    product = mb.matmul(x=a, y=b, name=ctx.name(node, "matmul"))
    product = mb.reshape(x=product, shape=_shape([sizes[c] for c in batch + left + right]),
                         name=ctx.name(node, "unflat"))
    return mb.identity(x=_permute(ctx, node, product, batch + left + right, out), name=ctx.name(node))
