"""Ops that move data without computing on it: ``broadcast_in_dim``, ``reshape``, ``transpose``,
``slice``, ``dynamic_slice``, ``dynamic_update_slice``, ``pad``, ``concatenate``, ``iota``,
``reverse``, ``get_tuple_element``."""

from __future__ import annotations

import numpy as np

from edgebuild_jax.convert.context import int_list
from edgebuild_jax.convert.dynamic import counter, sizes_of
from edgebuild_jax.convert.registry import converts


@converts("stablehlo.broadcast_in_dim")
def broadcast_in_dim(op, cx):
    """Operand dim i goes to result dim ``broadcast_dimensions[i]``: put the operand's dims in that
    order (a transpose when they are not increasing), unsqueeze the new ones, then Expand."""
    (x,) = cx.inputs(op)
    mapping = int_list(op.attributes["broadcast_dimensions"])
    target = cx.shape(op.result)
    order = sorted(range(len(mapping)), key=lambda i: mapping[i])
    if order != list(range(len(mapping))):
        x = cx.node("Transpose", [x], {"perm": order})
    placed = sorted(mapping)
    new_axes = [d for d in range(len(target)) if d not in placed]
    if new_axes:
        x = cx.node("Unsqueeze", [x, cx.ints(new_axes)])
    if None in target:
        raise cx.error(op, "a broadcast to a dynamic shape needs dynamic_broadcast_in_dim")
    return [cx.node("Expand", [x, cx.ints(target)])]


@converts("stablehlo.reshape")
def reshape(op, cx):
    (x,) = cx.inputs(op)
    return [cx.node("Reshape", [x, cx.ints(cx.shape(op.result))])]


@converts("stablehlo.transpose")
def transpose(op, cx):
    (x,) = cx.inputs(op)
    return [cx.node("Transpose", [x], {"perm": int_list(op.attributes["permutation"])})]


@converts("stablehlo.slice")
def slice_(op, cx):
    (x,) = cx.inputs(op)
    starts = int_list(op.attributes["start_indices"])
    limits = int_list(op.attributes["limit_indices"])
    strides = int_list(op.attributes["strides"])
    return [cx.node("Slice", [x, cx.ints(starts), cx.ints(limits), cx.ints(range(len(starts))),
                              cx.ints(strides)])]


def clamped_starts(cx, scalars, sizes, dims, room=None):
    """Start indices clamped to ``[0, dim - size]`` as the spec says, as one int64 vector: folded
    when every start is a constant, else concatenated and clamped with Max/Min. ``room``: the
    run-time ``dim - size`` vector, when dims or sizes are dynamic (nothing is folded then)."""
    folded = [cx.folded(s) for s in scalars]
    if room is None and all(f is not None for f in folded):
        starts = [int(np.clip(int(f), 0, d - n)) for f, d, n in zip(folded, dims, sizes)]
        return cx.ints(starts), starts
    pieces = [cx.node("Reshape", [cx.node("Cast", [s], {"to": 7}), cx.ints([1])]) for s in scalars]
    starts = cx.node("Concat", pieces, {"axis": 0}) if len(pieces) > 1 else pieces[0]
    starts = cx.node("Max", [starts, cx.ints([0] * len(dims))])
    starts = cx.node("Min", [starts, room if room is not None else cx.ints([d - n for d, n in zip(dims, sizes)])])
    return starts, None


@converts("stablehlo.dynamic_slice")
def dynamic_slice(op, cx):
    x, *scalars = cx.inputs(op)
    sizes = int_list(op.attributes["slice_sizes"])
    dims = cx.shape(op.operands[0])
    if not dims:
        return [cx.node("Identity", [x])]
    room = None
    if None in dims:  # the slice sizes are static, the operand's dims known at run time
        room = cx.node("Sub", [sizes_of(cx, x, op.operands[0], range(len(dims))), cx.ints(sizes)])
    starts, known = clamped_starts(cx, scalars, sizes, dims, room)
    axes = cx.ints(range(len(dims)))
    if known is not None:
        ends = cx.ints([s + n for s, n in zip(known, sizes)])
    else:
        ends = cx.node("Add", [starts, cx.ints(sizes)])
    return [cx.node("Slice", [x, starts, ends, axes])]


@converts("stablehlo.dynamic_update_slice")
def dynamic_update_slice(op, cx):
    """ScatterND of the whole update at the clamped start: the indices are the update's own
    positions (a constant grid) plus the start vector."""
    x, update, *scalars = cx.inputs(op)
    dims = cx.shape(op.operands[0])
    sizes = cx.shape(op.operands[1])
    rank = len(dims)
    if rank == 0:
        return [update]
    if None in dims or None in sizes:
        indices = update_indices_at_run_time(cx, op, x, update, scalars)
    else:
        starts, known = clamped_starts(cx, scalars, sizes, dims)
        grid = np.stack(np.meshgrid(*[np.arange(n) for n in sizes], indexing="ij"), axis=-1).astype(np.int64)
        if known is not None:
            indices = cx.const(grid + np.asarray(known, dtype=np.int64), name="indices")
        else:
            indices = cx.node("Add", [cx.const(grid, name="grid"), starts])
    if cx.np_dtype(op.result) == np.bool_:  # Core ML's scatter takes no booleans: scatter 0/1 ints
        x, update = (cx.node("Cast", [v], {"to": 6}) for v in (x, update))
        return [cx.node("Cast", [cx.node("ScatterND", [x, indices, update])], {"to": 9})]
    return [cx.node("ScatterND", [x, indices, update])]


def update_indices_at_run_time(cx, op, x, update, scalars):
    """ScatterND's indices for an update whose dims (or the operand's) are known only at run
    time: the update's grid of positions built per dim with Range, plus the start clamped to
    ``[0, dim - update dim]``."""
    rank = len(cx.shape(op.operands[0]))
    sizes = sizes_of(cx, update, op.operands[1], range(rank))
    room = cx.node("Sub", [sizes_of(cx, x, op.operands[0], range(rank)), sizes])
    starts, _ = clamped_starts(cx, scalars, None, [None] * rank, room)
    eye = np.eye(rank, dtype=np.int64)
    indices = starts  # [rank]: broadcasts against the grid
    for d in range(rank):
        along = counter(cx, sizes_of(cx, update, op.operands[1], [d]), d, rank + 1)
        indices = cx.node("Add", [indices, cx.node("Mul", [along, cx.ints(eye[d])])])
    return cx.node("Expand", [indices, cx.node("Concat", [sizes, cx.ints([rank])], {"axis": 0})])


@converts("stablehlo.pad")
def pad(op, cx):
    """Interior padding first (each dim: unsqueeze a unit dim after it, pad that dim, merge the two
    and drop the trailing fill), then positive edge padding with Pad, then negative edges with Slice."""
    x, fill = cx.inputs(op)
    low = int_list(op.attributes["edge_padding_low"])
    high = int_list(op.attributes["edge_padding_high"])
    interior = int_list(op.attributes["interior_padding"])
    dims = list(cx.shape(op.operands[0]))
    rank = len(dims)
    floats = np.issubdtype(cx.np_dtype(op.result), np.floating)
    if None in dims:
        return [pad_dynamic(op, cx, x, fill, low, high, interior, floats)]
    for d, k in enumerate(interior):
        if k == 0 or dims[d] <= 1:
            dims[d] = dims[d] + max(dims[d] - 1, 0) * k
            continue
        n = dims[d]
        x = cx.node("Unsqueeze", [x, cx.ints([d + 1])])
        x = grow_axis(cx, x, fill, dims[:d + 1] + [1] + dims[d + 1:], d + 1, 0, k, floats)
        x = cx.node("Reshape", [x, cx.ints(dims[:d] + [n * (k + 1)] + dims[d + 1:])])
        dims[d] = n + (n - 1) * k
        x = cx.node("Slice", [x, cx.ints([0]), cx.ints([dims[d]]), cx.ints([d])])
    grow_low = [max(v, 0) for v in low]
    grow_high = [max(v, 0) for v in high]
    if any(grow_low) or any(grow_high):
        if floats:
            x = cx.node("Pad", [x, cx.ints(grow_low + grow_high), fill], {"mode": "constant"})
            dims = [n + a + b for n, a, b in zip(dims, grow_low, grow_high)]
        for d in range(rank):
            if not floats and (grow_low[d] or grow_high[d]):
                x = grow_axis(cx, x, fill, dims, d, grow_low[d], grow_high[d], floats)
                dims[d] += grow_low[d] + grow_high[d]
    cut_low = [max(-v, 0) for v in low]
    cut_high = [max(-v, 0) for v in high]
    if any(cut_low) or any(cut_high):
        x = cx.node("Slice", [x, cx.ints(cut_low), cx.ints([n - c for n, c in zip(dims, cut_high)]),
                              cx.ints(range(rank))])
    elif not any(interior) and not any(grow_low) and not any(grow_high):
        x = cx.node("Identity", [x])
    return [x]


END = np.iinfo(np.int64).max  # a Slice end past any dim


def pad_dynamic(op, cx, x, fill, low, high, interior, floats):
    """``pad`` of an operand with dims known only at run time, step for step as the static path:
    the sizes a step needs are read from the value it works on (merging a dim with its interior
    fill is a Reshape to the run-time shape with that dim as -1; the trailing fill and negative
    edges are cut by Slice ends counted from the end)."""
    rank = len(low)
    for d, k in enumerate(interior):
        if k == 0:
            continue
        before = x
        x = cx.node("Unsqueeze", [x, cx.ints([d + 1])])
        x = grow_axis_dynamic(cx, x, fill, rank + 1, d + 1, 0, k, floats)
        merged = [cx.node("Shape", [before], {"start": 0, "end": d})] if d else []
        merged.append(cx.ints([-1]))
        if d + 1 < rank:
            merged.append(cx.node("Shape", [before], {"start": d + 1}))
        x = cx.node("Reshape", [x, cx.node("Concat", merged, {"axis": 0}) if len(merged) > 1 else merged[0]])
        x = cx.node("Slice", [x, cx.ints([0]), cx.ints([-k]), cx.ints([d])])
    grow_low, grow_high = [max(v, 0) for v in low], [max(v, 0) for v in high]
    if any(grow_low) or any(grow_high):
        if floats:
            x = cx.node("Pad", [x, cx.ints(grow_low + grow_high), fill], {"mode": "constant"})
        else:
            for d in range(rank):
                if grow_low[d] or grow_high[d]:
                    x = grow_axis_dynamic(cx, x, fill, rank, d, grow_low[d], grow_high[d], floats)
    cut_low, cut_high = [max(-v, 0) for v in low], [max(-v, 0) for v in high]
    if any(cut_low) or any(cut_high):
        x = cx.node("Slice", [x, cx.ints(cut_low), cx.ints([-c if c else END for c in cut_high]),
                              cx.ints(range(rank))])
    elif not any(interior) and not any(grow_low) and not any(grow_high):
        x = cx.node("Identity", [x])
    return x


def grow_axis_dynamic(cx, x, fill, rank, axis, before, after, floats):
    """:func:`grow_axis` of a value whose shape is known only at run time."""
    if floats:
        return cx.node("Pad", [x, cx.ints([before, after]), fill, cx.ints([axis])], {"mode": "constant"})
    pieces = []
    for count in (before, None, after):
        if count is None:
            pieces.append(x)
        elif count:
            parts = [cx.node("Shape", [x], {"start": 0, "end": axis})] if axis else []
            parts.append(cx.ints([count]))
            if axis + 1 < rank:
                parts.append(cx.node("Shape", [x], {"start": axis + 1}))
            block = cx.node("Concat", parts, {"axis": 0}) if len(parts) > 1 else parts[0]
            pieces.append(cx.node("Expand", [cx.node("Reshape", [fill, cx.ints([1] * rank)]), block]))
    return cx.node("Concat", pieces, {"axis": axis})


def grow_axis(cx, x, fill, dims, axis, before, after, floats):
    """``x`` (shape ``dims``) with ``before``/``after`` fill elements along ``axis``: a Pad for
    floats, else a Concat of fill blocks (Core ML pads only floats)."""
    if floats:
        return cx.node("Pad", [x, cx.ints([before, after]), fill, cx.ints([axis])], {"mode": "constant"})
    pieces = []
    for count in (before, None, after):
        if count is None:
            pieces.append(x)
        elif count:
            shape = dims[:axis] + [count] + dims[axis + 1:]
            pieces.append(cx.node("Expand", [cx.node("Reshape", [fill, cx.ints([1] * len(dims))]), cx.ints(shape)]))
    return cx.node("Concat", pieces, {"axis": axis})


@converts("stablehlo.concatenate")
def concatenate(op, cx):
    return [cx.node("Concat", cx.inputs(op), {"axis": int(op.attributes["dimension"].value)})]


@converts("stablehlo.iota")
def iota(op, cx):
    """A constant: the counter along ``iota_dimension``, broadcast over the others."""
    shape = cx.shape(op.result)
    if None in shape:
        raise cx.error(op, "an iota of a dynamic shape is not supported")
    axis = int(op.attributes["iota_dimension"].value)
    counts = np.arange(shape[axis]).reshape([-1 if d == axis else 1 for d in range(len(shape))])
    return [cx.const(np.broadcast_to(counts, shape).astype(cx.np_dtype(op.result)), name="iota")]


@converts("stablehlo.reverse")
def reverse(op, cx):
    """A Gather with a constant descending index along each reversed dim."""
    (x,) = cx.inputs(op)
    shape = cx.shape(op.operands[0])
    for d in int_list(op.attributes["dimensions"]):
        if shape[d] is None:  # the descending index of a run-time length
            # (n - 1) - [0, n): onnxruntime rewrites a Gather of a descending Range into a Slice
            # that reads its limit -1 as the last element, and would return nothing
            count = sizes_of(cx, x, op.operands[0], [d])
            last = cx.node("Sub", [count, cx.ints([1])])
            backwards = cx.node("Sub", [last, counter(cx, count, 0, 1)])
            x = cx.node("Gather", [x, backwards], {"axis": d})
            continue
        x = cx.node("Gather", [x, cx.ints(range(shape[d] - 1, -1, -1))], {"axis": d})
    return [x]


@converts("stablehlo.get_tuple_element")
def get_tuple_element(op, cx):
    raise cx.error(op, "tuples are not supported", hint="export the function with array results")
