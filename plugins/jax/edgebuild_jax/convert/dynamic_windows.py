"""``custom_call @stablehlo.dynamic_reduce_window``: the reduce_window jax.export writes when a
window's padding or size depends on a symbolic dim (max pooling with SAME padding over symbolic
spatial sizes; ``cumsum``/``cumprod``/``cummax``/``cummin`` over a symbolic length).

Its operands are the operand, the init value, then four 1-D tensors (window dimensions, window
strides, base dilations, window dilations) and the [rank, 2] padding; the combining function is
the one in ``called_computations``. Two shapes of it convert:

* a window of compile-time size: the padding (run-time or not) is applied first with Pad,
  filled with the combiner's identity, and the window reduced by MaxPool or AveragePool;
* a window whose size is known only at run time along one dim, with stride 1 and that dim padded
  on one side only: jax's cumulative reduction (window = the dim, padding = the dim - 1 before for
  forward, after for reverse), which becomes CumSum, or for max, min and product a reduction of
  the operand masked by a lower (or upper) triangle built from the run-time length.
"""

from __future__ import annotations

import numpy as np

from edgebuild_jax.convert.dynamic import folded_through_concat
from edgebuild_jax.convert.reductions import REDUCERS, describe_body, identity, is_identity, single_combiner

INT64 = 7  # onnx TensorProto.INT64


def scalar_parts(cx, value) -> list:
    """The elements of a small shape vector built by Concat/Reshape of scalars: each an int when
    known at compile time, None when computed at run time."""
    known = cx.folded(value)
    if known is not None:
        return [int(v) for v in np.reshape(known, -1)]
    producer = value.producer()
    kind = getattr(producer, "op_type", None)
    if kind == "Concat":
        return [part for v in producer.inputs for part in scalar_parts(cx, v)]
    if kind == "Reshape":
        return scalar_parts(cx, producer.inputs[0])
    return [None]


def vector(cx, value, rank: int) -> list:
    parts = scalar_parts(cx, value)
    return parts if len(parts) == rank else [None] * rank


def dynamic_reduce_window(op, cx):
    count = (len(op.operands) - 5) // 2
    if count != 1:
        raise cx.error(op, "a dynamic_reduce_window of several operands is not supported",
                       hint="one operand at a time")
    x, _, window_v, strides_v, base_v, dilations_v, padding_v = cx.inputs(op)
    name = str(op.attributes["called_computations"][0]).lstrip("@").strip('"')
    function = cx.functions.get(name)
    if function is None:
        raise cx.error(op, f"dynamic_reduce_window calls {name}, which the module does not define")
    block = function.regions[0].blocks[0]
    rank = len(cx.shape(op.operands[0]))
    dtype = cx.np_dtype(op.results[0])
    combiner = single_combiner(op, block)
    if combiner not in ("stablehlo.add", "stablehlo.maximum", "stablehlo.minimum", "stablehlo.multiply"):
        raise cx.error(op, f"only max, min, sum and product windows are supported (body: "
                           f"{describe_body(op, block)})", hint="max_pool, avg_pool, cumsum, cumprod, cummax")
    if not is_identity(cx, op.operands[1], combiner, dtype):
        raise cx.error(op, "a dynamic_reduce_window whose init value is not the identity of its op is not "
                           "supported", hint="init with -inf for max, 0 for sum")
    window = vector(cx, window_v, rank)
    strides, base, dilations = (vector(cx, v, rank) for v in (strides_v, base_v, dilations_v))
    padding = vector(cx, padding_v, 2 * rank)
    if None in strides or None in dilations or None in base:
        raise cx.error(op, "window strides and dilations known only at run time are not supported",
                       hint="use constant strides and dilations")
    if any(b != 1 for b in base):
        raise cx.error(op, "base_dilations other than 1 are not supported", hint="dilate the input explicitly")
    if None in window:
        return [cumulative(op, cx, x, combiner, dtype, window, strides, dilations, padding)]
    return [pooled(op, cx, x, combiner, dtype, window, strides, dilations, padding_v, padding)]


def identity_const(cx, combiner, dtype):
    return cx.const(np.asarray(identity(combiner, dtype), dtype=dtype), name="fill")


def cumulative(op, cx, x, combiner, dtype, window, strides, dilations, padding):
    rank = len(window)
    axes = [d for d in range(rank) if window[d] is None]
    pairs = [padding[2 * d:2 * d + 2] for d in range(rank)]
    others_plain = all(window[d] == 1 and pairs[d] == [0, 0] for d in range(rank) if d not in axes)
    if (len(axes) != 1 or not others_plain or strides[axes[0]] != 1 or dilations[axes[0]] != 1
            or pairs[axes[0]] not in ([None, 0], [0, None])):
        raise cx.error(op, "a window whose size is known only at run time is supported only as a cumulative "
                           "reduction (one dim, stride 1, padded on one side)",
                       hint="use jnp.cumsum / cumprod / cummax / cummin, or a constant window")
    axis = axes[0]
    reverse = pairs[axis] == [0, None]
    if combiner == "stablehlo.add":
        return cx.node("CumSum", [x, cx.ints([axis])], {"reverse": int(reverse)})
    # out[..., i] = reduce over j of (x[..., j] where j <= i (j >= i reversed), else the identity)
    perm = [d for d in range(rank) if d != axis] + [axis]
    moved = cx.node("Transpose", [x], {"perm": perm}) if perm != list(range(rank)) else x
    length = cx.node("Shape", [x], {"start": axis, "end": axis + 1})
    zero, one = cx.const(np.asarray(0, np.int64)), cx.const(np.asarray(1, np.int64))
    positions = cx.node("Range", [zero, cx.node("Reshape", [length, cx.ints([])]), one])
    rows = cx.node("Unsqueeze", [positions, cx.ints([1])])
    columns = cx.node("Unsqueeze", [positions, cx.ints([0])])
    mask = cx.node("GreaterOrEqual" if reverse else "LessOrEqual", [columns, rows])
    spread = cx.node("Unsqueeze", [moved, cx.ints([rank - 1])])  # [..., 1, n] against the [n, n] mask
    masked = cx.node("Where", [mask, spread, identity_const(cx, combiner, dtype)])
    out = cx.node(REDUCERS[combiner], [masked, cx.ints([-1])], {"keepdims": 0})
    if perm != list(range(rank)):
        out = cx.node("Transpose", [out], {"perm": [perm.index(d) for d in range(rank)]})
    return out


def pooled(op, cx, x, combiner, dtype, window, strides, dilations, padding_v, padding):
    rank = len(window)
    if dtype.kind != "f" or combiner == "stablehlo.multiply":
        raise cx.error(op, f"only float max, min and sum windows of constant size are supported ({dtype})",
                       hint="max_pool or avg_pool on floats")
    negate = combiner == "stablehlo.minimum"  # min is max of the negation, its padding -inf there too
    if negate:
        x = cx.node("Neg", [x])
    fill_with = "stablehlo.maximum" if negate else combiner
    padded = [d for d in range(rank) if padding[2 * d] != 0 or padding[2 * d + 1] != 0]
    if padded:
        if None in padding:  # [rank, 2] -> ONNX's [lows..., highs...]
            pads = cx.node("Cast", [padding_v], {"to": INT64})
            pads = cx.node("Reshape", [cx.node("Transpose", [pads], {"perm": [1, 0]}), cx.ints([-1])])
        else:
            pads = cx.ints(padding[0::2] + padding[1::2])
        x = cx.node("Pad", [x, pads, identity_const(cx, fill_with, dtype)], {"mode": "constant"})
    windowed = [d for d in range(rank) if window[d] != 1 or strides[d] != 1]
    if not windowed:
        y = cx.node("Identity", [x])
        return cx.node("Neg", [y]) if negate else y
    if len(windowed) > 3:
        raise cx.error(op, "windows over more than 3 dims are not supported", hint="pool in stages")
    kept = [d for d in range(rank) if d not in windowed]
    perm = kept + windowed
    if perm != list(range(rank)):
        x = cx.node("Transpose", [x], {"perm": perm})
    folded = len(kept) != 2
    unfolded = x
    if folded:  # the kept dims as a batch of one channel, sizes read at run time
        spatial = cx.node("Shape", [x], {"start": len(kept)})
        x = cx.node("Reshape", [x, cx.node("Concat", [cx.ints([-1, 1]), spatial], {"axis": 0})])
    attrs = {"kernel_shape": [window[d] for d in windowed], "strides": [strides[d] for d in windowed]}
    if combiner == "stablehlo.add":
        if any(dilations[d] != 1 for d in windowed):
            raise cx.error(op, "a dilated sum window is not supported", hint="use an undilated window")
        size = int(np.prod(attrs["kernel_shape"]))
        y = cx.node("AveragePool", [x], attrs)
        y = cx.node("Mul", [y, cx.const(np.asarray(size, dtype))])
    else:
        y = cx.node("MaxPool", [x], {**attrs, "dilations": [dilations[d] for d in windowed]})
    if folded:
        lead = cx.node("Shape", [unfolded], {"start": 0, "end": len(kept)})
        y = cx.node("Reshape", [y, cx.node("Concat", [lead, cx.node("Shape", [y], {"start": 2})], {"axis": 0})])
    if perm != list(range(rank)):
        y = cx.node("Transpose", [y], {"perm": [perm.index(d) for d in range(rank)]})
    return cx.node("Neg", [y]) if negate else y
