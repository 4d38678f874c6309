"""Ops of shape-polymorphic exports, whose sizes are known only at run time:
``get_dimension_size``, ``dynamic_broadcast_in_dim``, ``dynamic_reshape``, ``dynamic_iota``,
``real_dynamic_slice``, ``dynamic_pad`` and ``dynamic_gather`` (a slice whose sizes are a tensor).

Shapes travel as 1-D int64 tensors computed with ONNX Shape, Gather and Concat; the integer
arithmetic JAX writes on sizes (convert, multiply, divide, concatenate of scalars) goes through
the ordinary elementwise converters and ends here as an operand.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from jaxlib.mlir.dialects import stablehlo

from edgebuild_jax.convert.context import int_list
from edgebuild_jax.convert.registry import converts

INT64 = 7  # onnx TensorProto.INT64


def as_int64(cx, value):
    """A shape or index operand as int64 (JAX writes them as i32), folded when constant."""
    known = cx.folded(value)
    if known is not None:
        return cx.const(np.asarray(known, dtype=np.int64), name="shape")
    return cx.node("Cast", [value], {"to": INT64})


def runtime_shape(cx, x, mlir_value):
    """The 1-D int64 shape of ``x``: a constant when every dim is static."""
    dims = cx.shape(mlir_value)
    if None not in dims:
        return cx.ints(dims)
    return cx.node("Shape", [x])


def sizes_of(cx, x, mlir_value, axes) -> ir.Value:
    """The 1-D int64 sizes of ``axes`` of ``x``: a constant when they are all static, else
    gathered from its run-time shape."""
    dims = cx.shape(mlir_value)
    axes = list(axes)
    if all(dims[a] is not None for a in axes):
        return cx.ints([dims[a] for a in axes])
    return cx.node("Gather", [cx.node("Shape", [x]), cx.ints(axes)], {"axis": 0})


def counter(cx, count: ir.Value, axis: int, rank: int) -> ir.Value:
    """``0 .. count-1`` (int64) along ``axis`` of a rank-``rank`` tensor, size 1 elsewhere:
    positions along a dim known only at run time (``count``: a 1-element int64)."""
    zero, one = cx.const(np.asarray(0, dtype=np.int64)), cx.const(np.asarray(1, dtype=np.int64))
    scalar = cx.node("Reshape", [count, cx.ints([])])
    values = cx.node("Range", [zero, scalar, one])
    others = [d for d in range(rank) if d != axis]
    return cx.node("Unsqueeze", [values, cx.ints(others)]) if others else values


def folded_through_concat(cx, value):
    """The compile-time value of ``value``, also when it is a Concat of constants (JAX builds
    padding vectors that way, and the concatenate converter does not fold)."""
    known = cx.folded(value)
    producer = value.producer()
    if known is None and producer is not None and producer.op_type == "Concat":
        parts = [cx.folded(v) for v in producer.inputs]
        if all(p is not None for p in parts):
            known = np.concatenate([np.reshape(p, -1) for p in parts])
    return known


@converts("stablehlo.get_dimension_size")
def get_dimension_size(op, cx):
    (x,) = cx.inputs(op)
    axis = int(op.attributes["dimension"].value)
    dtype = cx.np_dtype(op.result)
    static = cx.shape(op.operands[0])[axis]
    if static is not None:  # a static dim of a partly dynamic tensor folds
        return [cx.const(np.asarray(static, dtype=dtype), name="dim")]
    size = cx.node("Shape", [x], {"start": axis, "end": axis + 1})
    size = cx.node("Reshape", [size, cx.ints([])])
    return [cx.node("Cast", [size], {"to": int(cx.dtype(op.result))})]


@converts("stablehlo.dynamic_broadcast_in_dim")
def dynamic_broadcast_in_dim(op, cx):
    """As ``broadcast_in_dim``: operand dims into the order of their target dims, new dims
    unsqueezed, then Expand to the run-time shape (ONNX's broadcast matches StableHLO's for a
    valid op: each operand dim is 1 or the target size)."""
    x, shape = cx.inputs(op)[:2]
    mapping = int_list(op.attributes["broadcast_dimensions"])
    rank = len(cx.shape(op.result))
    order = sorted(range(len(mapping)), key=lambda i: mapping[i])
    if order != list(range(len(mapping))):
        x = cx.node("Transpose", [x], {"perm": order})
    placed = sorted(mapping)
    new_axes = [d for d in range(rank) if d not in placed]
    if new_axes:
        x = cx.node("Unsqueeze", [x, cx.ints(new_axes)])
    return [cx.node("Expand", [x, as_int64(cx, shape)])]


@converts("stablehlo.dynamic_reshape")
def dynamic_reshape(op, cx):
    x, shape = cx.inputs(op)
    # allowzero: the sizes are literal (JAX writes 0 for an empty piece), not ONNX's "copy this dim"
    return [cx.node("Reshape", [x, as_int64(cx, shape)], {"allowzero": 1})]


@converts("stablehlo.dynamic_iota")
def dynamic_iota(op, cx):
    """Range over the iota dim's size, cast to the result type, placed on its axis and expanded
    to the whole shape."""
    (shape,) = cx.inputs(op)
    axis = int(op.attributes["iota_dimension"].value)
    rank = len(cx.shape(op.result))
    shape = as_int64(cx, shape)
    count = cx.node("Gather", [shape, cx.const(np.asarray(axis, dtype=np.int64))], {"axis": 0})
    zero, one = cx.const(np.asarray(0, dtype=np.int64)), cx.const(np.asarray(1, dtype=np.int64))
    values = cx.node("Cast", [cx.node("Range", [zero, count, one])], {"to": int(cx.dtype(op.result))})
    if rank > 1:
        values = cx.node("Unsqueeze", [values, cx.ints([d for d in range(rank) if d != axis])])
        values = cx.node("Expand", [values, shape])
    return [values]


@converts("stablehlo.real_dynamic_slice")
def real_dynamic_slice(op, cx):
    x, starts, limits, strides = cx.inputs(op)
    rank = len(cx.shape(op.result))
    return [cx.node("Slice", [x, as_int64(cx, starts), as_int64(cx, limits), cx.ints(range(rank)),
                              as_int64(cx, strides)])]


@converts("stablehlo.dynamic_pad")
def dynamic_pad(op, cx):
    """Edge padding only (ONNX Pad, whose negative pads crop as StableHLO's do); interior padding
    is refused unless it is a constant zero."""
    x, fill, low, high, interior = cx.inputs(op)
    spaced = folded_through_concat(cx, interior)
    if spaced is None or np.any(np.asarray(spaced) != 0):
        raise cx.error(op, "dynamic_pad with interior padding is not supported",
                       hint="pad without interior padding, or give the pad static sizes")
    pads = cx.node("Concat", [as_int64(cx, low), as_int64(cx, high)], {"axis": 0})
    return [cx.node("Pad", [x, pads, fill], {"mode": "constant"})]


@converts("stablehlo.dynamic_gather")
def dynamic_gather(op, cx):
    """A gather with one start index vector and run-time slice sizes — what JAX writes for
    ``x[a:b]`` with symbolic bounds — is a Slice: starts clamped to ``[0, dim - size]`` as the
    spec says, ends ``start + size``, then the collapsed dims dropped. Any other (``take`` along
    an axis of a symbolically shaped operand: batch dims of indices) is a gather whose window
    sizes are a tensor."""
    x, indices, sizes = cx.inputs(op)
    dn = stablehlo.GatherDimensionNumbers(op.attributes["dimension_numbers"])
    indices_shape = cx.shape(op.operands[1])
    rank = len(cx.shape(op.operands[0]))
    collapsed = list(dn.collapsed_slice_dims)
    one_vector = len(indices_shape) == 1 and dn.index_vector_dim == 0 and indices_shape[0] is not None
    if not one_vector or list(dn.operand_batching_dims) \
            or list(dn.offset_dims) != list(range(rank - len(collapsed))):
        from edgebuild_jax.convert.indexing import gather_dynamic  # indexing builds on this module

        known = cx.folded(sizes)
        window = [int(v) for v in np.reshape(known, -1)] if known is not None else as_int64(cx, sizes)
        return [gather_dynamic(cx, op, x, indices, dn, window)]
    index_map = list(dn.start_index_map)
    indices = as_int64(cx, indices)
    pieces = []
    for d in range(rank):
        if d in index_map:
            at = cx.ints([index_map.index(d)])
            pieces.append(cx.node("Gather", [indices, at], {"axis": 0}))
        else:
            pieces.append(cx.ints([0]))
    starts = cx.node("Concat", pieces, {"axis": 0}) if rank > 1 else pieces[0]
    sizes = as_int64(cx, sizes)
    room = cx.node("Sub", [runtime_shape(cx, x, op.operands[0]), sizes])
    starts = cx.node("Min", [cx.node("Max", [starts, cx.ints([0] * rank)]), room])
    ends = cx.node("Add", [starts, sizes])
    out = cx.node("Slice", [x, starts, ends, cx.ints(range(rank))])
    if collapsed:
        # a Reshape, not a Squeeze: Core ML's squeeze keeps a dim it cannot prove is 1, and a
        # slice at run-time starts has no dim it can
        kept = [d for d in range(rank) if d not in collapsed]
        result = cx.shape(op.result)
        target = cx.ints(result) if None not in result else \
            cx.node("Gather", [cx.node("Shape", [out]), cx.ints(kept)], {"axis": 0})
        out = cx.node("Reshape", [out, target])
    return [out]
