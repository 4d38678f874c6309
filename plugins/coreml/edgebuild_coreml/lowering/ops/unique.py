"""Unique: the distinct elements (or slices along ``axis``), with first indices, inverse indices
and counts. The number of distinct items is only known at run time; Core ML holds that as a
dynamic dimension (``range_1d`` up to a computed count), as its ``non_zero`` does.

The items are compared all against all (an n x n table, fine for the small tensors Unique
meets in practice): item i's first occurrence is the least j equal to it; an item is kept where
that is i itself. Each item's slot in the output is the number of kept items before it —
smaller in lexicographic order when ``sorted``, earlier in the input otherwise — so every output
is a masked sum over the table, exact in int32.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._util import (
    dim,
    is_static,
    normalize_axis,
    rank_of,
    select,
    shape_of,
)
from edgebuild_coreml.lowering.registry import lowers


def _as_int(ctx, node, x, tag):
    return mb.cast(x=x, dtype="int32", name=ctx.name(node, tag))


def _items(ctx, node, x, axis):
    """The items as rows of an [n, m] matrix (m = 1 without an axis)."""
    if axis is None:
        return mb.reshape(x=x, shape=[-1, 1], name=ctx.name(node, "items"))
    if axis:
        perm = [axis] + [d for d in range(rank_of(x)) if d != axis]
        x = mb.transpose(x=x, perm=perm, name=ctx.name(node, "axis_first"))
    rest = shape_of(x)[1:]
    if all(is_static(d) for d in rest):
        return mb.reshape(x=x, shape=[-1, int(np.prod(rest, dtype=np.int64))], name=ctx.name(node, "items"))
    if not is_static(shape_of(x)[0]):
        ctx.fail(node, f"the input's shape {tuple(shape_of(x))} must be known when the model is built",
                 "pin the input shapes in the recipe")
    return mb.reshape(x=x, shape=[int(shape_of(x)[0]), -1], name=ctx.name(node, "items"))


def _lexicographic_less(ctx, node, left, right, width):
    """before[i, j]: item i sorts before item j (``left`` [n, 1, m], ``right`` [1, n, m]) — at
    the first position where they differ, i's element is the smaller."""
    differs = mb.not_equal(x=left, y=right, name=ctx.name(node, "differs"))
    positions = mb.range_1d(start=np.int32(0), end=width, step=np.int32(1), name=ctx.name(node, "positions"))
    marked = select(differs, positions, width, name=ctx.name(node, "difference_positions"))  # m where equal
    first_difference = mb.reduce_min(x=marked, axes=[-1], keep_dims=True, name=ctx.name(node, "first_difference"))
    deciding = mb.equal(x=positions, y=first_difference, name=ctx.name(node, "deciding"))
    smaller = mb.logical_and(x=mb.less(x=left, y=right), y=deciding, name=ctx.name(node, "smaller_there"))
    return mb.reduce_max(x=_as_int(ctx, node, smaller, "smaller_int"), axes=[-1], keep_dims=False,
                         name=ctx.name(node, "less"))


@lowers("Unique", since=11)
def unique(ctx, node):
    x = ctx.input(node, 0)
    axis = ctx.attr(node, "axis")
    axis = None if axis is None else normalize_axis(ctx, node, int(axis), rank_of(x))
    items = _items(ctx, node, x, axis)
    n = dim(items, 0, name=ctx.name(node, "n"))
    width = dim(items, 1, name=ctx.name(node, "m"))
    left = mb.expand_dims(x=items, axes=[1], name=ctx.name(node, "left"))  # [n, 1, m]
    right = mb.expand_dims(x=items, axes=[0], name=ctx.name(node, "right"))  # [1, n, m]
    same = mb.reduce_min(x=_as_int(ctx, node, mb.equal(x=left, y=right), "equal_int"), axes=[-1], keep_dims=False,
                         name=ctx.name(node, "same"))  # [n, n] 0/1
    index = mb.range_1d(start=np.int32(0), end=n, step=np.int32(1), name=ctx.name(node, "index"))
    # first[i] = min{j : item j == item i}: j where equal, n elsewhere
    candidates = mb.add(x=mb.mul(x=same, y=index), y=mb.mul(x=mb.sub(x=np.int32(1), y=same), y=n),
                        name=ctx.name(node, "candidates"))
    first = mb.reduce_min(x=candidates, axes=[1], keep_dims=False, name=ctx.name(node, "first"))
    kept = _as_int(ctx, node, mb.equal(x=first, y=index), "kept")  # [n] 0/1
    if ctx.attr(node, "sorted", 1):
        before = _lexicographic_less(ctx, node, left, right, width)  # before[j, i]: j sorts before i
    else:  # before[j, i]: j comes before i's first occurrence
        before = _as_int(ctx, node, mb.less(x=mb.expand_dims(x=index, axes=[1]), y=mb.expand_dims(x=first, axes=[0])),
                         "earlier")
    slot = mb.reduce_sum(x=mb.mul(x=before, y=mb.expand_dims(x=kept, axes=[1])), axes=[0], keep_dims=False,
                         name=ctx.name(node, "slot"))  # [n]: the output slot of each item's value
    count = mb.reduce_sum(x=kept, axes=[0], keep_dims=False, name=ctx.name(node, "count"))
    slots = mb.range_1d(start=np.int32(0), end=count, step=np.int32(1), name=ctx.name(node, "slots"))  # [K]
    in_slot = _as_int(ctx, node, mb.equal(x=mb.expand_dims(x=slots, axes=[1]), y=mb.expand_dims(x=slot, axes=[0])),
                      "in_slot")  # [K, n]
    first_of_slot = mb.reduce_sum(x=mb.mul(x=mb.mul(x=in_slot, y=kept), y=index), axes=[1], keep_dims=False,
                                  name=ctx.name(node, "indices"))
    counts = mb.reduce_sum(x=in_slot, axes=[1], keep_dims=False, name=ctx.name(node, "counts"))
    source = mb.reshape(x=x, shape=[-1], name=ctx.name(node, "flat")) if axis is None else x
    y = mb.gather(x=source, indices=first_of_slot, axis=0 if axis is None else axis, name=ctx.name(node, "y"))
    return y, first_of_slot, mb.identity(x=slot, name=ctx.name(node, "inverse")), counts
