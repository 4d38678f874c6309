"""Einsum with one or two operands, as reductions, transposes and one batched matmul.

MIL's own einsum takes only a few fixed equations, so the general case is rewritten:
operand-only letters are summed out, then A -> [batch, left, contracted], B -> [batch,
contracted, right], a matmul, and a reshape/transpose into the output's letter order.
Needs static shapes; ellipses and repeated letters (diagonals) are not supported.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import is_static, shape_of
from edgebuild_coreml.lowering.registry import lowers


def _parse(ctx, node, equation: str, count: int):
    equation = equation.replace(" ", "")
    if "..." in equation:
        ctx.fail(node, f"ellipsis in equation {equation!r} is not supported")
    lhs, _, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != count or count not in (1, 2):
        ctx.fail(node, f"equation {equation!r}: only one or two operands are supported")
    if not _:
        letters = sorted(set("".join(terms)))
        rhs = "".join(c for c in letters if "".join(terms).count(c) == 1)
    for term in terms + [rhs]:
        if len(set(term)) != len(term):
            ctx.fail(node, f"equation {equation!r}: repeated letters in one term (diagonals) are not supported")
    return terms, rhs


def _sum_out(x, term: str, keep: str):
    """Sum the axes of ``x`` whose letters are not in ``keep``."""
    axes = [i for i, c in enumerate(term) if c not in keep]
    if axes:
        x = mb.reduce_sum(x=x, axes=axes, keep_dims=False)
    return x, "".join(c for c in term if c in keep)


def _permute(x, term: str, order: str):
    if term == order:
        return x
    return mb.transpose(x=x, perm=[term.index(c) for c in order])


@lowers("Einsum", since=12)
def einsum(ctx, node):
    operands = [ctx.input(node, i) for i in range(len(node.inputs))]
    terms, out = _parse(ctx, node, ctx.attr(node, "equation"), len(operands))
    sizes = {}
    for x, term in zip(operands, terms):
        shape = shape_of(x)
        if len(shape) != len(term) or not all(is_static(d) for d in shape):
            ctx.fail(node, "needs static input shapes matching the equation", hint="pin the input shapes in the recipe")
        for c, d in zip(term, shape):
            sizes[c] = max(sizes.get(c, 1), int(d))
    if len(operands) == 1:
        x, term = _sum_out(operands[0], terms[0], out)
        return mb.identity(x=_permute(x, term, out), name=ctx.name(node))

    (a, b), (ta, tb) = operands, terms
    a, ta = _sum_out(a, ta, tb + out)
    b, tb = _sum_out(b, tb, ta + out)
    batch = "".join(c for c in ta if c in tb and c in out)
    contracted = "".join(c for c in ta if c in tb and c not in out)
    left = "".join(c for c in ta if c not in tb)
    right = "".join(c for c in tb if c not in ta)
    flat = lambda letters: int(np.prod([sizes[c] for c in letters], dtype=np.int64))  # noqa: E731
    # Each operand keeps its own batch sizes: size-1 dims broadcast in matmul, as in ONNX.
    a_batch = [int(shape_of(a)[ta.index(c)]) for c in batch]
    b_batch = [int(shape_of(b)[tb.index(c)]) for c in batch]
    a = mb.reshape(x=_permute(a, ta, batch + left + contracted), shape=a_batch + [flat(left), flat(contracted)])
    b = mb.reshape(x=_permute(b, tb, batch + contracted + right), shape=b_batch + [flat(contracted), flat(right)])
    product = mb.matmul(x=a, y=b, name=ctx.name(node, "matmul"))
    product = mb.reshape(x=product, shape=[sizes[c] for c in batch + left + right])
    return mb.identity(x=_permute(product, batch + left + right, out), name=ctx.name(node))
