"""``gather`` and ``scatter`` with general dimension numbers.

Both lower to one full operand index per element: for every element of the result (gather) or
of the updates (scatter), the operand position it reads or writes, built from the start indices
(moved to the dims they map to), the offset within the window and the batching dims' own
positions. GatherND and ScatterND then take those indices as they are; a gather that is a plain
``take`` along one axis becomes an ONNX Gather instead.
"""

from __future__ import annotations

import numpy as np

from jaxlib.mlir.dialects import stablehlo

from edgebuild_jax.convert.dynamic import counter, sizes_of
from edgebuild_jax.convert.registry import converts

INT64 = 7  # onnx TensorProto.INT64


def index_vectors(cx, indices, rank: int, index_vector_dim: int):
    """The start indices as int64 with the index vector as the last dim."""
    indices = cx.node("Cast", [indices], {"to": INT64})
    if index_vector_dim == rank:
        return cx.node("Unsqueeze", [indices, cx.ints([rank])])
    if index_vector_dim != rank - 1:
        perm = [d for d in range(rank) if d != index_vector_dim] + [index_vector_dim]
        return cx.node("Transpose", [indices], {"perm": perm})
    return indices


def full_indices(cx, *, indices, indices_rank, index_vector_dim, index_map, out_shape, window_dims,
                 collapsed, operand_batching, indices_batching, operand_shape, window_sizes, clamp):
    """An int64 tensor ``out_shape + [operand rank]``: the operand index of each element.

    ``window_dims`` are the dims of ``out_shape`` that walk the window (offset_dims /
    update_window_dims), the others walk the start indices' batch dims in order. ``clamp``: clamp
    each start to ``[0, dim - window size]`` (gather's rule)."""
    rank = len(operand_shape)
    out_rank = len(out_shape)
    batch_out = [d for d in range(out_rank) if d not in window_dims]
    windowed = [d for d in range(rank) if d not in collapsed and d not in operand_batching]

    # the compile-time part: window offsets and batching positions, per operand dim
    fixed = np.zeros(list(out_shape) + [rank], dtype=np.int64)
    for j, d in enumerate(windowed):
        along = window_dims[j]
        fixed[..., d] += np.arange(out_shape[along]).reshape([-1 if a == along else 1 for a in range(out_rank)])
    for d, s in zip(operand_batching, indices_batching):
        along = batch_out[s if s < index_vector_dim else s - 1]
        fixed[..., d] += np.arange(out_shape[along]).reshape([-1 if a == along else 1 for a in range(out_rank)])

    if not index_map:  # every position is known: only batching dims and windows
        return cx.const(fixed, name="window")
    # the computed part: the starts moved to the operand dims they index
    starts = index_vectors(cx, indices, indices_rank, index_vector_dim)
    if clamp:
        limits = [operand_shape[d] - window_sizes[d] for d in index_map]
        starts = cx.node("Min", [cx.node("Max", [starts, cx.ints([0])]), cx.ints(limits)])
    pick = [index_map.index(d) if d in index_map else 0 for d in range(rank)]
    mask = [1 if d in index_map else 0 for d in range(rank)]
    starts = cx.node("Gather", [starts, cx.ints(pick)], {"axis": -1})
    if not all(mask):
        starts = cx.node("Mul", [starts, cx.ints(mask)])
    placed = [out_shape[d] if d in batch_out else 1 for d in range(out_rank)] + [rank]
    starts = cx.node("Reshape", [starts, cx.ints(placed)])
    return cx.node("Add", [starts, cx.const(fixed, name="window")])


def plain_take_axis(index_map, collapsed, operand_batching, operand_shape, slice_sizes, offset_dims, batch_rank):
    """The axis of a gather that is ``take(operand, indices, axis)``, else None."""
    if operand_batching or len(index_map) != 1 or list(collapsed) != list(index_map):
        return None
    (axis,) = index_map
    if any(slice_sizes[d] != operand_shape[d] for d in range(len(operand_shape)) if d != axis):
        return None
    out_rank = len(operand_shape) - 1 + batch_rank
    if list(offset_dims) != list(range(axis)) + list(range(axis + batch_rank, out_rank)):
        return None
    return axis


@converts("stablehlo.gather")
def gather(op, cx):
    operand, indices = cx.inputs(op)
    dn = stablehlo.GatherDimensionNumbers(op.attributes["dimension_numbers"])
    operand_shape = cx.shape(op.operands[0])
    indices_shape = cx.shape(op.operands[1])
    out_shape = cx.shape(op.result)
    slice_sizes = [int(v) for v in op.attributes["slice_sizes"]]
    index_map = list(dn.start_index_map)
    ivd = dn.index_vector_dim
    batch_rank = len(indices_shape) - (0 if ivd == len(indices_shape) else 1)
    axis = plain_take_axis(index_map, list(dn.collapsed_slice_dims), list(dn.operand_batching_dims),
                           operand_shape, slice_sizes, list(dn.offset_dims), batch_rank)
    if axis is not None:
        taken = cx.node("Cast", [indices], {"to": INT64})
        if ivd < len(indices_shape):
            taken = cx.node("Squeeze", [taken, cx.ints([ivd])])
        taken = cx.node("Max", [taken, cx.ints([0])])
        if operand_shape[axis] is None:  # a table of run-time length: clamp to its last row then
            last = cx.node("Sub", [sizes_of(cx, operand, op.operands[0], [axis]), cx.ints([1])])
        else:
            last = cx.ints([operand_shape[axis] - 1])
        taken = cx.node("Min", [taken, last])
        return [cx.node("Gather", [operand, taken], {"axis": axis})]
    if None in operand_shape or None in indices_shape or None in out_shape:
        return [gather_dynamic(cx, op, operand, indices, dn, slice_sizes)]
    full = full_indices(cx, indices=indices, indices_rank=len(indices_shape), index_vector_dim=ivd,
                        index_map=index_map, out_shape=out_shape, window_dims=list(dn.offset_dims),
                        collapsed=list(dn.collapsed_slice_dims), operand_batching=list(dn.operand_batching_dims),
                        indices_batching=list(dn.start_indices_batching_dims), operand_shape=operand_shape,
                        window_sizes=slice_sizes, clamp=True)
    return [cx.node("GatherND", [operand, full])]


def gather_dynamic(cx, op, operand, indices, dn, slice_sizes):
    """``gather`` with dims known only at run time: the full operand index of each result element
    summed from parts that broadcast against each other — the window offsets, the clamped starts
    over the indices' batch dims, and each batching dim's own positions — then GatherND.
    ``slice_sizes``: ints (gather's attribute), or a 1-D int64 value (dynamic_gather's operand)."""
    operand_shape, indices_shape = cx.shape(op.operands[0]), cx.shape(op.operands[1])
    rank, out_rank, ivd = len(operand_shape), len(cx.shape(op.result)), dn.index_vector_dim
    window_dims, index_map = list(dn.offset_dims), list(dn.start_index_map)
    collapsed, operand_batching = list(dn.collapsed_slice_dims), list(dn.operand_batching_dims)
    batch_out = [d for d in range(out_rank) if d not in window_dims]
    windowed = [d for d in range(rank) if d not in collapsed and d not in operand_batching]
    batch_axes = [a for a in range(len(indices_shape)) if a != ivd]  # indices dims, in result order

    static_sizes = isinstance(slice_sizes, (list, tuple))

    def size_of(d):  # one window size as a 1-element int64
        return cx.ints([slice_sizes[d]]) if static_sizes else \
            cx.node("Gather", [slice_sizes, cx.ints([d])], {"axis": 0})

    window = np.zeros([1] * out_rank + [rank], dtype=np.int64)
    for j, d in enumerate(windowed):
        if static_sizes:
            along = window_dims[j]
            window = window + np.eye(rank, dtype=np.int64)[d] * np.arange(slice_sizes[d]).reshape(
                [-1 if a == along else 1 for a in range(out_rank)] + [1])
    full = cx.const(window, name="window")
    for j, d in enumerate(windowed if not static_sizes else []):
        positions = cx.node("Unsqueeze", [counter(cx, size_of(d), window_dims[j], out_rank), cx.ints([out_rank])])
        full = cx.node("Add", [full, cx.node("Mul", [positions, cx.ints(np.eye(rank, dtype=np.int64)[d])])])
    for d, s in zip(operand_batching, list(dn.start_indices_batching_dims)):
        along = batch_out[batch_axes.index(s)]
        positions = counter(cx, sizes_of(cx, indices, op.operands[1], [s]), along, out_rank)
        positions = cx.node("Unsqueeze", [positions, cx.ints([out_rank])])
        full = cx.node("Add", [full, cx.node("Mul", [positions, cx.ints(np.eye(rank, dtype=np.int64)[d])])])
    if index_map:
        starts = index_vectors(cx, indices, len(indices_shape), ivd)
        window_sizes = cx.ints([slice_sizes[d] for d in index_map]) if static_sizes else \
            cx.node("Gather", [slice_sizes, cx.ints(index_map)], {"axis": 0})
        room = cx.node("Sub", [sizes_of(cx, operand, op.operands[0], index_map), window_sizes])
        starts = cx.node("Min", [cx.node("Max", [starts, cx.ints([0])]), room])
        pick = [index_map.index(d) if d in index_map else 0 for d in range(rank)]
        mask = [1 if d in index_map else 0 for d in range(rank)]
        starts = cx.node("Gather", [starts, cx.ints(pick)], {"axis": -1})
        if not all(mask):
            starts = cx.node("Mul", [starts, cx.ints(mask)])
        if window_dims:
            starts = cx.node("Unsqueeze", [starts, cx.ints(window_dims)])
        full = cx.node("Add", [starts, full])
    # every result dim at its size: the indices' batch dims and the windows, then the index vector
    pieces = []
    for d in range(out_rank):
        if d in batch_out:
            pieces.append(sizes_of(cx, indices, op.operands[1], [batch_axes[batch_out.index(d)]]))
        else:
            pieces.append(size_of(windowed[window_dims.index(d)]))
    pieces.append(cx.ints([rank]))
    full = cx.node("Expand", [full, cx.node("Concat", pieces, {"axis": 0})])
    return cx.node("GatherND", [operand, full])


REDUCTIONS = {"stablehlo.add": "add", "stablehlo.multiply": "mul", "stablehlo.maximum": "max",
              "stablehlo.minimum": "min",
              # on booleans, scattered as 0/1 ints: or is max, and is min
              "stablehlo.or": "max", "stablehlo.and": "min"}


def scatter_reduction(op, cx) -> str:
    """ScatterND's reduction for the update body: ``none`` when it returns the update, else the
    one combining op it applies to the current value and the update."""
    block = op.regions[0].blocks[0]
    current, update = block.arguments[0], block.arguments[1]
    body = list(block.operations)
    returned = body[-1].operands[0]
    if len(body) == 1 and returned == update:
        return "none"
    if len(body) == 2 and body[0].operation.name in REDUCTIONS and returned == body[0].results[0]:
        operands = list(body[0].operands)
        if operands in ([current, update], [update, current]):
            return REDUCTIONS[body[0].operation.name]
    names = ", ".join(o.operation.name for o in body)
    raise cx.error(op, f"a scatter whose update body is ({names}) is not supported",
                   hint="only replacement, add, multiply, max and min updates convert")


@converts("stablehlo.scatter")
def scatter(op, cx, as_ints=False):
    values = cx.inputs(op)
    if len(values) != 3:
        raise cx.error(op, "a scatter of several operands at once is not supported",
                       hint="scatter each array on its own")
    operand, indices, updates = values
    if as_ints:
        operand, updates = (cx.node("Cast", [v], {"to": 6}) for v in (operand, updates))
    dn = stablehlo.ScatterDimensionNumbers(op.attributes["scatter_dimension_numbers"])
    operand_shape = cx.shape(op.operands[0])
    indices_shape = cx.shape(op.operands[1])
    updates_shape = cx.shape(op.operands[2])
    reduction = scatter_reduction(op, cx)
    if cx.np_dtype(op.result) == np.bool_ and not as_ints:  # Core ML's scatter takes no booleans: scatter 0/1 ints
        flags = scatter(op, cx, as_ints=True)
        return [cx.node("Cast", [flags[0]], {"to": 9})]
    if None in operand_shape or None in indices_shape or None in updates_shape:
        return [scatter_dynamic(cx, op, operand, indices, updates, dn, reduction)]
    full = full_indices(cx, indices=indices, indices_rank=len(indices_shape), index_vector_dim=dn.index_vector_dim,
                        index_map=list(dn.scattered_dims_to_operand_dims), out_shape=updates_shape,
                        window_dims=list(dn.update_window_dims), collapsed=list(dn.inserted_window_dims),
                        operand_batching=list(dn.input_batching_dims),
                        indices_batching=list(dn.scatter_indices_batching_dims), operand_shape=operand_shape,
                        window_sizes=None, clamp=False)
    index_map = list(dn.scattered_dims_to_operand_dims)
    limits = window_limits(operand_shape, updates_shape, list(dn.update_window_dims),
                           list(dn.inserted_window_dims), list(dn.input_batching_dims), index_map)
    known = cx.folded(indices)
    if known is not None and in_bounds(known, dn.index_vector_dim, limits):
        return [cx.node("ScatterND", [operand, full, updates], {"reduction": reduction})]
    return [scatter_dropping_out_of_bounds(cx, operand, full, updates, reduction, indices, dn, limits,
                                           operand_shape, updates_shape, indices_shape)]


def window_limits(operand_shape, updates_shape, window_dims, inserted, batching, index_map):
    """The largest in-bounds start of each scattered dim: dim size minus the window's extent."""
    windowed = [d for d in range(len(operand_shape)) if d not in inserted and d not in batching]
    extent = {d: updates_shape[window_dims[j]] for j, d in enumerate(windowed)}
    return [operand_shape[d] - extent.get(d, 1) for d in index_map]


def in_bounds(indices: np.ndarray, index_vector_dim: int, limits) -> bool:
    vectors = np.moveaxis(indices[..., None] if index_vector_dim == indices.ndim else indices, index_vector_dim, -1)
    return bool(np.all(vectors >= 0) and np.all(vectors <= np.asarray(limits)))


def scatter_dropping_out_of_bounds(cx, operand, full, updates, reduction, indices, dn, limits,
                                   operand_shape, updates_shape, indices_shape):
    """The spec skips an update window that does not fit in the operand, where ScatterND would
    fail: scatter into the flattened operand plus one spare element, send the elements of those
    windows to the spare, and cut it off."""
    rank = len(operand_shape)
    size = int(np.prod(operand_shape))
    strides = [int(np.prod(operand_shape[d + 1:])) for d in range(rank)]
    starts = index_vectors(cx, indices, len(indices_shape), dn.index_vector_dim)
    fits = cx.node("And", [cx.node("GreaterOrEqual", [starts, cx.ints([0])]),
                           cx.node("LessOrEqual", [starts, cx.ints(limits)])])
    fits = cx.node("ReduceMin", [cx.node("Cast", [fits], {"to": 6}), cx.ints([-1])], {"keepdims": 0})
    batch_out = [d for d in range(len(updates_shape)) if d not in list(dn.update_window_dims)]
    placed = [updates_shape[d] if d in batch_out else 1 for d in range(len(updates_shape))] + [1]
    fits = cx.node("Cast", [cx.node("Reshape", [fits, cx.ints(placed)])], {"to": 9})
    linear = cx.node("ReduceSum", [cx.node("Mul", [full, cx.ints(strides)]), cx.ints([-1])], {"keepdims": 1})
    linear = cx.node("Where", [fits, linear, cx.ints([size])])
    flat = cx.node("Reshape", [operand, cx.ints([size])])
    spare = cx.node("Slice", [flat, cx.ints([0]), cx.ints([1])])
    flat = cx.node("Concat", [flat, spare], {"axis": 0})
    flat = cx.node("ScatterND", [flat, linear, updates], {"reduction": reduction})
    flat = cx.node("Slice", [flat, cx.ints([0]), cx.ints([size])])
    return cx.node("Reshape", [flat, cx.ints(operand_shape)])


def scatter_dynamic(cx, op, operand, indices, updates, dn, reduction):
    """``scatter`` with dims known only at run time: each update element's operand index summed
    from broadcasting parts (window positions along the updates' own run-time dims, the starts
    over the indices' batch dims, batching positions), then scattered as
    :func:`scatter_dropping_out_of_bounds` does, with the strides and limits read at run time."""
    operand_shape, indices_shape = cx.shape(op.operands[0]), cx.shape(op.operands[1])
    updates_shape = cx.shape(op.operands[2])
    rank, up_rank, ivd = len(operand_shape), len(updates_shape), dn.index_vector_dim
    window_dims, index_map = list(dn.update_window_dims), list(dn.scattered_dims_to_operand_dims)
    inserted, batching = list(dn.inserted_window_dims), list(dn.input_batching_dims)
    batch_out = [d for d in range(up_rank) if d not in window_dims]
    windowed = [d for d in range(rank) if d not in inserted and d not in batching]
    batch_axes = [a for a in range(len(indices_shape)) if a != ivd]
    eye = np.eye(rank, dtype=np.int64)

    def placed(positions, along, d):  # positions along one updates dim, as operand dim d's index
        positions = cx.node("Unsqueeze", [counter(cx, positions, along, up_rank), cx.ints([up_rank])])
        return cx.node("Mul", [positions, cx.ints(eye[d])])

    full = cx.const(np.zeros([1] * up_rank + [rank], dtype=np.int64), name="origin")
    for j, d in enumerate(windowed):
        full = cx.node("Add", [full, placed(sizes_of(cx, updates, op.operands[2], [window_dims[j]]),
                                            window_dims[j], d)])
    for d, s in zip(batching, list(dn.scatter_indices_batching_dims)):
        full = cx.node("Add", [full, placed(sizes_of(cx, indices, op.operands[1], [s]),
                                            batch_out[batch_axes.index(s)], d)])
    fits = None
    if index_map:
        starts = index_vectors(cx, indices, len(indices_shape), ivd)
        # a window fits when every start is in [0, dim - its extent along that dim]
        extents = [sizes_of(cx, updates, op.operands[2], [window_dims[windowed.index(d)]]) if d in windowed
                   else cx.ints([1]) for d in index_map]
        extents = cx.node("Concat", extents, {"axis": 0}) if len(extents) > 1 else extents[0]
        limits = cx.node("Sub", [sizes_of(cx, operand, op.operands[0], index_map), extents])
        fits = cx.node("And", [cx.node("GreaterOrEqual", [starts, cx.ints([0])]),
                               cx.node("LessOrEqual", [starts, limits])])
        fits = cx.node("ReduceMin", [cx.node("Cast", [fits], {"to": 6}), cx.ints([-1])], {"keepdims": 1})
        pick = [index_map.index(d) if d in index_map else 0 for d in range(rank)]
        starts = cx.node("Gather", [starts, cx.ints(pick)], {"axis": -1})
        if not all(d in index_map for d in range(rank)):
            starts = cx.node("Mul", [starts, cx.ints([1 if d in index_map else 0 for d in range(rank)])])
        if window_dims:
            starts = cx.node("Unsqueeze", [starts, cx.ints(window_dims)])
            fits = cx.node("Unsqueeze", [fits, cx.ints(window_dims)])
        full = cx.node("Add", [starts, full])
    full = cx.node("Expand", [full, cx.node("Concat", [cx.node("Shape", [updates]), cx.ints([rank])], {"axis": 0})])

    # the flattened operand plus one spare element that windows which do not fit write to
    dims = cx.node("Shape", [operand])
    size = cx.node("ReduceProd", [dims, cx.ints([0])], {"keepdims": 1})
    strides = [cx.node("ReduceProd", [cx.node("Shape", [operand], {"start": d + 1}), cx.ints([0])], {"keepdims": 1})
               for d in range(rank - 1)] + [cx.ints([1])]
    strides = cx.node("Concat", strides, {"axis": 0}) if rank > 1 else strides[0]
    linear = cx.node("ReduceSum", [cx.node("Mul", [full, strides]), cx.ints([-1])], {"keepdims": 1})
    if fits is not None:
        linear = cx.node("Where", [cx.node("Cast", [fits], {"to": 9}), linear, size])
    flat = cx.node("Reshape", [operand, cx.ints([-1])])
    flat = cx.node("Concat", [flat, cx.node("Slice", [flat, cx.ints([0]), cx.ints([1])])], {"axis": 0})
    flat = cx.node("ScatterND", [flat, linear, updates], {"reduction": reduction})
    flat = cx.node("Slice", [flat, cx.ints([0]), size])
    return cx.node("Reshape", [flat, dims])
