"""Reductions: ``reduce`` (sum, max, min, product, all, any, and JAX's argmax/argmin pairs) and
``reduce_window`` (max and sum pooling, so average pooling too).

A StableHLO reduction carries its combining function as a region; the converters read that
region's one op and pick the ONNX reduction or pool of the same meaning.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from edgebuild_jax.convert.context import attribute, int_list
from edgebuild_jax.convert.registry import converts

REDUCERS = {"stablehlo.add": "ReduceSum", "stablehlo.maximum": "ReduceMax", "stablehlo.minimum": "ReduceMin",
            "stablehlo.multiply": "ReduceProd", "stablehlo.and": "ReduceMin", "stablehlo.or": "ReduceMax"}
COMBINERS = {"stablehlo.add": "Add", "stablehlo.maximum": "Max", "stablehlo.minimum": "Min",
             "stablehlo.multiply": "Mul", "stablehlo.and": "And", "stablehlo.or": "Or"}


def body_ops(op, block=None):
    """The ops of a reduction's region (or of ``block``, a called body), without its return, and
    the return."""
    block = block if block is not None else op.regions[0].blocks[0]
    ops = list(block.operations)
    return ops[:-1], ops[-1], block


def single_combiner(op, block=None) -> str | None:
    """The name of the one binary op applied to the body's two arguments, if that is the body."""
    ops, ret, block = body_ops(op, block)
    if len(ops) != 1 or len(block.arguments) != 2:
        return None
    (body,) = ops
    args = list(block.arguments)
    if body.operation.name not in REDUCERS or set(body.operands) != set(args) or len(body.operands) != 2:
        return None
    if list(ret.operands) != [body.results[0]]:
        return None
    return body.operation.name


def identity(combiner: str, dtype: np.dtype):
    """The init value that leaves the combination unchanged."""
    if dtype == np.bool_:
        return {"stablehlo.and": True, "stablehlo.or": False}.get(combiner)
    if combiner == "stablehlo.add":
        return 0
    if combiner == "stablehlo.multiply":
        return 1
    low, high = (-np.inf, np.inf) if dtype.kind == "f" else (np.iinfo(dtype).min, np.iinfo(dtype).max)
    return {"stablehlo.maximum": low, "stablehlo.minimum": high}.get(combiner)


def is_identity(cx, init, combiner: str, dtype: np.dtype) -> bool:
    value = cx.constant_value(init)
    source = init.owner
    while value is None and getattr(source, "name", None) in ("stablehlo.broadcast_in_dim", "stablehlo.reshape"):
        init = source.operands[0]  # JAX broadcasts a scalar init to a scalar: see through it
        value, source = cx.constant_value(init), init.owner
    want = identity(combiner, dtype)
    return value is not None and want is not None and bool(np.all(np.asarray(value) == want))


def describe_body(op, block=None) -> str:
    ops, _, _ = body_ops(op, block)
    return ", ".join(o.operation.name for o in ops) or "no ops"


def reduce_axes(cx, x, reducer: str, axes: list[int], is_bool: bool):
    """``reducer`` over ``axes`` without keeping them; booleans as 0/1 integers."""
    if not axes:
        return x
    if is_bool:
        x = cx.node("Cast", [x], {"to": ir.DataType.INT32})
    out = cx.node(reducer, [x, cx.ints(axes)], {"keepdims": 0})
    if is_bool:
        out = cx.node("Cast", [out], {"to": ir.DataType.BOOL})
    return out


@converts("stablehlo.reduce")
def reduce(op, cx):
    count = len(op.results)
    inputs = cx.inputs(op)
    operands, inits = inputs[:count], inputs[count:]
    axes = int_list(op.attributes["dimensions"])
    if count == 1:
        combiner = single_combiner(op)
        if combiner is None:
            raise cx.error(op, f"a reduce whose body is not one combining op is not supported (body: "
                               f"{describe_body(op)})", hint="reduce with add, maximum, minimum, multiply, and, or")
        dtype = cx.np_dtype(op.result)
        is_bool = dtype == np.bool_
        if combiner in ("stablehlo.and", "stablehlo.or") and not is_bool:
            raise cx.error(op, "a bitwise and/or reduction of integers is not supported",
                           hint="reduce booleans, or use sum/max/min")
        out = reduce_axes(cx, operands[0], REDUCERS[combiner], axes, is_bool)
        if not axes or not is_identity(cx, op.operands[1], combiner, dtype):
            out = cx.node(COMBINERS[combiner], [out, inits[0]])  # init combined once, as the spec says
        return [out]
    if count == 2:
        return arg_reduce(op, cx, operands, axes)
    raise cx.error(op, f"a reduce of {count} operands is not supported (body: {describe_body(op)})",
                   hint="reduce one operand at a time, or argmax/argmin")


def arg_reduce(op, cx, operands, axes):
    """JAX's argmax/argmin: a (value, iota index) pair reduced by a body that compares the values
    (GT for max, LT for min) and selects value and index."""
    ops, _, block = body_ops(op)
    args = list(block.arguments)
    first = next((o for o in ops if o.operation.name == "stablehlo.compare"), None)
    names = {o.operation.name for o in ops}
    index_source = op.operands[1].owner
    if (first is None or not names <= {"stablehlo.compare", "stablehlo.or", "stablehlo.and", "stablehlo.select"}
            or list(first.operands) != [args[0], args[2]] or len(axes) != 1
            or getattr(index_source, "name", None) != "stablehlo.iota"
            or int(index_source.attributes["iota_dimension"]) != axes[0]):
        raise cx.error(op, f"a two-operand reduce other than argmax/argmin is not supported (body: "
                           f"{describe_body(op)})", hint="use jnp.argmax / jnp.argmin")
    direction = str(first.attributes["comparison_direction"]).split()[-1].rstrip(">")
    if direction not in ("GT", "LT"):
        raise cx.error(op, f"an arg-reduction comparing with {direction} is not supported", hint="use GT or LT")
    axis = axes[0]
    value_op, index_op = ("ReduceMax", "ArgMax") if direction == "GT" else ("ReduceMin", "ArgMin")
    values = cx.node(value_op, [operands[0], cx.ints([axis])], {"keepdims": 0})
    index = cx.node(index_op, [operands[0]], {"axis": axis, "keepdims": 0, "select_last_index": 0})
    index = cx.node("Cast", [index], {"to": cx.dtype(op.results[1])})
    return [values, index]


@converts("stablehlo.reduce_window")
def reduce_window(op, cx):
    """Max, min or sum over sliding windows: the windowed dims are moved last and the rest folded into
    a batch of one channel, then MaxPool, or AveragePool counting padding times the window size."""
    if len(op.results) != 1:
        raise cx.error(op, "a reduce_window of several operands is not supported", hint="one operand at a time")
    x, init = cx.inputs(op)
    shape = cx.shape(op.operands[0])
    rank = len(shape)
    dtype = cx.np_dtype(op.result)
    combiner = single_combiner(op)
    if combiner not in ("stablehlo.add", "stablehlo.maximum", "stablehlo.minimum") or dtype.kind != "f":
        raise cx.error(op, f"only float max, min and sum windows are supported (body: {describe_body(op)}, "
                           f"{dtype})", hint="max_pool or avg_pool on floats")
    window = int_list(op.attributes["window_dimensions"])
    strides = int_list(attribute(op, "window_strides")) or [1] * rank
    base = int_list(attribute(op, "base_dilations")) or [1] * rank
    dilations = int_list(attribute(op, "window_dilations")) or [1] * rank
    padding = (np.asarray(op.attributes["padding"]).reshape(rank, 2).tolist() if "padding" in op.attributes
               else [[0, 0]] * rank)
    if any(b != 1 for b in base):
        raise cx.error(op, "base_dilations other than 1 are not supported", hint="dilate the input explicitly")
    if any(p < 0 for pair in padding for p in pair):
        raise cx.error(op, "negative padding is not supported", hint="slice the input instead")
    if not is_identity(cx, op.operands[1], combiner, dtype):
        raise cx.error(op, "a reduce_window whose init value is not the identity of its op is not supported",
                       hint="init with -inf for max, 0 for sum")
    windowed = [d for d in range(rank) if window[d] != 1 or strides[d] != 1 or padding[d] != [0, 0]]
    if not windowed:
        return [cx.node("Identity", [x])]
    if len(windowed) > 3:
        raise cx.error(op, "windows over more than 3 dims are not supported", hint="pool in stages")
    kept = [d for d in range(rank) if d not in windowed]
    perm = kept + windowed
    if perm != list(range(rank)):
        x = cx.node("Transpose", [x], {"perm": perm})
    lead = [shape[d] for d in kept]
    spatial = [shape[d] for d in windowed]
    folded = len(kept) != 2
    symbolic = None in shape  # then the folds read the sizes at run time
    unfolded = x
    if folded:
        target = (cx.node("Concat", [cx.ints([-1, 1]), cx.node("Shape", [x], {"start": len(kept)})], {"axis": 0})
                  if symbolic else cx.ints([int(np.prod(lead)), 1] + spatial))
        x = cx.node("Reshape", [x, target])
    attrs = {"kernel_shape": [window[d] for d in windowed], "strides": [strides[d] for d in windowed],
             "pads": [padding[d][0] for d in windowed] + [padding[d][1] for d in windowed]}
    if combiner in ("stablehlo.maximum", "stablehlo.minimum"):
        attrs["dilations"] = [dilations[d] for d in windowed]
        if combiner == "stablehlo.minimum":  # min is max of the negation; MaxPool's padding is -inf there
            x = cx.node("Neg", [x])
        y = cx.node("MaxPool", [x], attrs)
        if combiner == "stablehlo.minimum":
            y = cx.node("Neg", [y])
    else:
        if any(dilations[d] != 1 for d in windowed):
            raise cx.error(op, "a dilated sum window is not supported", hint="use an undilated window")
        size = int(np.prod(attrs["kernel_shape"]))
        y = cx.node("AveragePool", [x], {**attrs, "count_include_pad": 1})
        y = cx.node("Mul", [y, cx.const(np.asarray(size, dtype))])
    out_shape = cx.shape(op.result)
    if folded and symbolic:
        lead_now = cx.node("Shape", [unfolded], {"start": 0, "end": len(kept)})
        y = cx.node("Reshape", [y, cx.node("Concat", [lead_now, cx.node("Shape", [y], {"start": 2})], {"axis": 0})])
    elif folded:
        y = cx.node("Reshape", [y, cx.ints([out_shape[d] for d in perm])])
    if perm != list(range(rank)):
        y = cx.node("Transpose", [y], {"perm": [perm.index(d) for d in range(rank)]})
    return [y]

