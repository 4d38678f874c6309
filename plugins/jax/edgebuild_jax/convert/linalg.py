"""Contractions: ``dot_general``, ``dot``, ``convolution`` and ``dynamic_conv`` (its padding an
operand, as jax.export writes ``SAME`` over a symbolic size).

``dot_general`` becomes Transpose + Reshape + MatMul (batch, free, contracted dims gathered on each
side) so that it lowers to one Core ML matmul whatever the dims' positions. ``convolution`` is moved
to the NCHW / OIHW layout ONNX Conv takes and its result moved back to the op's layout. Input
dilation (how JAX writes transposed convolutions) is ONNX ConvTranspose when the kernel is a
constant, else zeros inserted by Unsqueeze + Pad + Reshape; negative padding becomes a Slice;
batch groups become feature groups. Window reversal is refused.
"""

from __future__ import annotations

import math

import numpy as np
from jaxlib.mlir.dialects import stablehlo

from edgebuild_jax.convert.context import attribute, int_list
from edgebuild_jax.convert.registry import converts


def _as_result_type(cx, op, x, operand):
    """Cast an operand to the result's element type (``preferred_element_type``) when they differ."""
    if cx.dtype(operand) != cx.dtype(op.result):
        return cx.node("Cast", [x], {"to": cx.dtype(op.result)})
    return x


def _static(cx, op, value):
    shape = cx.shape(value)
    if None in shape:
        raise cx.error(op, "dynamic shapes are not supported here", hint="export with static shapes")
    return shape


def _permute(cx, x, perm):
    if list(perm) == list(range(len(perm))):
        return x
    return cx.node("Transpose", [x], {"perm": list(perm)})


def _reshape(cx, x, current, target):
    if list(current) == list(target):
        return x
    return cx.node("Reshape", [x, cx.ints(target)])


@converts("stablehlo.dot_general")
def dot_general(op, cx):
    """Result dims are batch dims, then lhs free dims, then rhs free dims (StableHLO's order)."""
    lhs, rhs = cx.inputs(op)
    lhs_shape, rhs_shape = cx.shape(op.operands[0]), cx.shape(op.operands[1])
    numbers = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    lhs_batch, rhs_batch = list(numbers.lhs_batching_dimensions), list(numbers.rhs_batching_dimensions)
    lhs_contract, rhs_contract = list(numbers.lhs_contracting_dimensions), list(numbers.rhs_contracting_dimensions)
    lhs_free = [d for d in range(len(lhs_shape)) if d not in lhs_batch + lhs_contract]
    rhs_free = [d for d in range(len(rhs_shape)) if d not in rhs_batch + rhs_contract]

    if None in lhs_shape + rhs_shape:
        return [_dynamic_dot_general(cx, op, lhs, rhs, lhs_batch, lhs_free, lhs_contract,
                                     rhs_batch, rhs_free, rhs_contract)]

    batch = [lhs_shape[d] for d in lhs_batch]
    size = lambda shape, dims: math.prod(shape[d] for d in dims)  # noqa: E731
    contracted = size(lhs_shape, lhs_contract)
    lead = [math.prod(batch)] if batch else []  # all batch dims as one, so MatMul is rank 2 or 3

    lhs = _as_result_type(cx, op, lhs, op.operands[0])
    rhs = _as_result_type(cx, op, rhs, op.operands[1])
    lhs = _permute(cx, lhs, lhs_batch + lhs_free + lhs_contract)
    lhs = _reshape(cx, lhs, batch + [lhs_shape[d] for d in lhs_free + lhs_contract],
                   lead + [size(lhs_shape, lhs_free), contracted])
    rhs = _permute(cx, rhs, rhs_batch + rhs_contract + rhs_free)
    rhs = _reshape(cx, rhs, batch + [rhs_shape[d] for d in rhs_contract + rhs_free],
                   lead + [contracted, size(rhs_shape, rhs_free)])
    product = cx.node("MatMul", [lhs, rhs])
    result = batch + [lhs_shape[d] for d in lhs_free] + [rhs_shape[d] for d in rhs_free]
    return [_reshape(cx, product, lead + [size(lhs_shape, lhs_free), size(rhs_shape, rhs_free)], result)]


def _dynamic_dot_general(cx, op, lhs, rhs, lhs_batch, lhs_free, lhs_contract, rhs_batch, rhs_free, rhs_contract):
    """``dot_general`` with dims unknown until run time: batch dims kept (MatMul broadcasts over
    them), free dims flattened with -1, the result's shape gathered from the operands' shapes.
    A contracted size known only at run time (attention's ``weights @ V`` over a symbolic
    sequence) is the product of those dims' run-time sizes."""
    lhs_shape, rhs_shape = cx.shape(op.operands[0]), cx.shape(op.operands[1])
    contracted = [lhs_shape[d] for d in lhs_contract] + [rhs_shape[d] for d in rhs_contract]
    lhs_dims = cx.node("Shape", [lhs])
    rhs_dims = cx.node("Shape", [rhs])

    def dims_of(shape_value, dims):
        return cx.node("Gather", [shape_value, cx.ints(dims)], {"axis": 0})

    lhs = _as_result_type(cx, op, lhs, op.operands[0])
    rhs = _as_result_type(cx, op, rhs, op.operands[1])
    lead = [dims_of(lhs_dims, lhs_batch)] if lhs_batch else []
    if None not in contracted:
        size = math.prod(lhs_shape[d] for d in lhs_contract)
        rows = lambda: [cx.ints([-1, size])]  # noqa: E731
        columns = lambda: [cx.ints([size, -1])]  # noqa: E731
    else:
        size = _contracted_size(cx, lhs_shape, lhs_contract, rhs_shape, rhs_contract,
                                lambda: dims_of(lhs_dims, lhs_contract))
        rows = lambda: [cx.ints([-1]), size]  # noqa: E731
        columns = lambda: [size, cx.ints([-1])]  # noqa: E731
    lhs = _permute(cx, lhs, lhs_batch + lhs_free + lhs_contract)
    lhs = cx.node("Reshape", [lhs, cx.node("Concat", lead + rows(), {"axis": 0})])
    rhs = _permute(cx, rhs, rhs_batch + rhs_contract + rhs_free)
    rhs = cx.node("Reshape", [rhs, cx.node("Concat", lead + columns(), {"axis": 0})])
    product = cx.node("MatMul", [lhs, rhs])
    parts = [dims_of(lhs_dims, lhs_batch + lhs_free)] if lhs_batch + lhs_free else []
    parts += [dims_of(rhs_dims, rhs_free)] if rhs_free else []
    if not parts:
        return cx.node("Reshape", [product, cx.ints([])])
    target = parts[0] if len(parts) == 1 else cx.node("Concat", parts, {"axis": 0})
    return cx.node("Reshape", [product, target])


def _contracted_size(cx, lhs_shape, lhs_contract, rhs_shape, rhs_contract, lhs_sizes):
    """The product of the contracted dims as a 1-element int64: a constant when either side has
    them static, else the lhs's run-time sizes (``lhs_sizes()`` makes them) multiplied."""
    for shape, dims in ((lhs_shape, lhs_contract), (rhs_shape, rhs_contract)):
        if None not in [shape[d] for d in dims]:
            return cx.ints([math.prod(shape[d] for d in dims)])
    if len(lhs_contract) == 1:
        return lhs_sizes()
    return cx.node("ReduceProd", [lhs_sizes(), cx.ints([0])], {"keepdims": 1})


@converts("stablehlo.dot")
def dot(op, cx):
    """Vector or matrix times vector or matrix: ONNX MatMul's 1-D and 2-D cases."""
    lhs, rhs = cx.inputs(op)
    lhs = _as_result_type(cx, op, lhs, op.operands[0])
    rhs = _as_result_type(cx, op, rhs, op.operands[1])
    return [cx.node("MatMul", [lhs, rhs])]


def _dilate(cx, x, shape, axis, factor):
    """Insert ``factor - 1`` zeros between neighbours along ``axis``: size n becomes (n-1)*factor+1."""
    if None in shape[axis:]:  # the dims before it are copied (Reshape's 0), whatever their size
        return _dilate_dynamic(cx, x, shape, axis, factor)
    n = shape[axis]
    x = cx.node("Unsqueeze", [x, cx.ints([axis + 1])])
    pads = [0] * (2 * (len(shape) + 1))
    pads[len(shape) + 1 + axis + 1] = factor - 1  # after each element, on the new axis
    x = cx.node("Pad", [x, cx.ints(pads)])
    widened = [0] * axis + [n * factor] + shape[axis + 1:]  # 0: the batch and feature dims, copied
    x = cx.node("Reshape", [x, cx.ints(widened)])
    shape = shape[:axis] + [(n - 1) * factor + 1] + shape[axis + 1:]
    x = cx.node("Slice", [x, cx.ints([0]), cx.ints([shape[axis]]), cx.ints([axis])])
    return x, shape


def _dilate_dynamic(cx, x, shape, axis, factor):
    """:func:`_dilate` of a value with dims known only at run time: the merged dim is -1 in a
    shape read from ``x``, and the trailing zeros are cut by an end counted from the end."""
    before = x
    x = cx.node("Unsqueeze", [x, cx.ints([axis + 1])])
    pads = [0] * (2 * (len(shape) + 1))
    pads[len(shape) + 1 + axis + 1] = factor - 1
    x = cx.node("Pad", [x, cx.ints(pads)])
    widened = [cx.node("Shape", [before], {"start": 0, "end": axis}), cx.ints([-1])]
    if axis + 1 < len(shape):
        widened.append(cx.node("Shape", [before], {"start": axis + 1}))
    x = cx.node("Reshape", [x, cx.node("Concat", widened, {"axis": 0})])
    x = cx.node("Slice", [x, cx.ints([0]), cx.ints([1 - factor]), cx.ints([axis])])
    n = shape[axis]
    return x, shape[:axis] + [None if n is None else (n - 1) * factor + 1] + shape[axis + 1:]


@converts("stablehlo.convolution")
def convolution(op, cx):
    """1-D, 2-D or 3-D convolution in any dimension layout; the batch and spatial dims may be
    dynamic, the kernel must be static."""
    padding = int_list(attribute(op, "padding"))
    return [_convolve(op, cx, *cx.inputs(op), padding=padding or None)]


@converts("stablehlo.dynamic_conv")
def dynamic_conv(op, cx):
    """A convolution whose padding is an operand (``[spatial, 2]``: what jax.export writes for
    ``SAME`` over a symbolic size): folded when constant, else an ONNX Pad at run time."""
    lhs, rhs, padding = cx.inputs(op)
    known = cx.folded(padding)
    if known is not None:
        return [_convolve(op, cx, lhs, rhs, padding=[int(p) for p in np.asarray(known).reshape(-1)])]
    return [_convolve(op, cx, lhs, rhs, padding=None, runtime_padding=padding)]


def _convolve(op, cx, lhs, rhs, *, padding, runtime_padding=None):
    """The ONNX of a ``convolution`` (or ``dynamic_conv``) op: ``padding`` the [lo, hi, ...]
    pairs (None: none), ``runtime_padding`` the ``[spatial, 2]`` operand of a dynamic_conv."""
    numbers = stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    lhs_shape, rhs_shape = cx.shape(op.operands[0]), _static(cx, op, op.operands[1])
    spatial = len(numbers.input_spatial_dimensions)
    if spatial not in (1, 2, 3):
        raise cx.error(op, f"a convolution with {spatial} spatial dims is not supported",
                       hint="use 1, 2 or 3 spatial dims")

    def ints_or(name, fill):
        values = int_list(attribute(op, name))
        return values if values else [fill] * spatial

    strides = ints_or("window_strides", 1)
    lhs_dilation = ints_or("lhs_dilation", 1)
    rhs_dilation = ints_or("rhs_dilation", 1)
    padding = padding or [0] * (2 * spatial)
    reversal = attribute(op, "window_reversal")
    if reversal is not None and any(bool(v) for v in reversal):
        raise cx.error(op, "window_reversal is not supported",
                       hint="flip the kernel in the source (jnp.flip) instead of reversing the window")
    groups = int(attribute(op, "feature_group_count").value) if "feature_group_count" in op.attributes else 1
    batch_groups = int(attribute(op, "batch_group_count").value) if "batch_group_count" in op.attributes else 1
    if batch_groups != 1 and (groups != 1 or lhs_shape[numbers.input_batch_dimension] is None):
        raise cx.error(op, f"batch_group_count={batch_groups} with feature groups or a dynamic batch is not supported",
                       hint="this comes from the gradient of a grouped convolution; convert the forward pass only")

    lhs = _as_result_type(cx, op, lhs, op.operands[0])
    rhs = _as_result_type(cx, op, rhs, op.operands[1])
    in_order = [numbers.input_batch_dimension, numbers.input_feature_dimension, *numbers.input_spatial_dimensions]
    kernel_order = [numbers.kernel_output_feature_dimension, numbers.kernel_input_feature_dimension,
                    *numbers.kernel_spatial_dimensions]
    out_order = [numbers.output_batch_dimension, numbers.output_feature_dimension, *numbers.output_spatial_dimensions]
    x = _permute(cx, lhs, in_order)
    x_shape = [lhs_shape[d] for d in in_order]
    if batch_groups != 1:
        # batch group g meets output features of group g: move the groups into the feature dim
        # ([G*N', C] -> [N', G*C]) and convolve with as many feature groups
        n, c, rest = x_shape[0], x_shape[1], x_shape[2:]
        if None in rest:  # spatial sizes read at run time
            spatial_sizes = cx.node("Shape", [x], {"start": 2})
            x = cx.node("Reshape", [x, cx.node("Concat", [cx.ints([batch_groups, n // batch_groups, c]),
                                                           spatial_sizes], {"axis": 0})])
            x = cx.node("Transpose", [x], {"perm": [1, 0, *range(2, len(x_shape) + 1)]})
            x_shape = [n // batch_groups, batch_groups * c, *rest]
            x = cx.node("Reshape", [x, cx.node("Concat", [cx.ints(x_shape[:2]), spatial_sizes], {"axis": 0})])
        else:
            x = cx.node("Reshape", [x, cx.ints([batch_groups, n // batch_groups, c, *rest])])
            x = cx.node("Transpose", [x], {"perm": [1, 0, *range(2, len(x_shape) + 1)]})
            x_shape = [n // batch_groups, batch_groups * c, *rest]
            x = cx.node("Reshape", [x, cx.ints(x_shape)])
        groups = batch_groups
    w = _permute(cx, rhs, kernel_order)
    kernel = [rhs_shape[d] for d in kernel_order][2:]

    weights = cx.constant_value(op.operands[1])
    transposed = None if runtime_padding is not None else _as_conv_transpose(
        cx, x, weights, kernel_order, lhs_dilation, strides, rhs_dilation, padding, groups, cx.dtype(op.result))
    if transposed is not None:
        return _permute(cx, transposed, [out_order.index(d) for d in range(len(out_order))])

    # Core ML takes kernel dilation only for constant weights: dilate a computed kernel itself
    if weights is None and any(d != 1 for d in rhs_dilation):
        w_shape = [rhs_shape[d] for d in kernel_order]
        for i, factor in enumerate(rhs_dilation):
            if factor != 1:
                w, w_shape = _dilate(cx, w, w_shape, 2 + i, factor)
        kernel, rhs_dilation = w_shape[2:], [1] * spatial

    for i, factor in enumerate(lhs_dilation):
        if factor != 1:
            x, x_shape = _dilate(cx, x, x_shape, 2 + i, factor)

    if runtime_padding is not None:  # ONNX Pad takes run-time pads (negative ones crop), Conv does not
        x = _pad_at_run_time(cx, x, runtime_padding, spatial, cx.np_dtype(op.result))
        pads = [0] * (2 * spatial)
    else:
        x, pads = _split_padding(cx, x, x_shape, padding, spatial)

    y = cx.node("Conv", [x, w], {"strides": strides, "dilations": rhs_dilation, "pads": pads,
                                 "group": groups, "kernel_shape": kernel})
    back = [out_order.index(d) for d in range(len(out_order))]
    return _permute(cx, y, back)


END = np.iinfo(np.int64).max  # a Slice end past any dim


def _split_padding(cx, x, x_shape, padding, spatial):
    """Negative padding crops the input (a Slice); the rest is Conv's own (non-negative) padding."""
    lows, highs = padding[0::2], padding[1::2]
    if any(p < 0 for p in padding):
        axes = [2 + i for i in range(spatial)]
        starts = [max(0, -lo) for lo in lows]
        if None in x_shape[2:]:  # the crop's ends counted from the end
            ends = [-max(0, -hi) or END for hi in highs]
        else:
            ends = [x_shape[2 + i] - max(0, -hi) for i, hi in enumerate(highs)]
        x = cx.node("Slice", [x, cx.ints(starts), cx.ints(ends), cx.ints(axes)])
    return x, [max(0, lo) for lo in lows] + [max(0, hi) for hi in highs]


def _pad_at_run_time(cx, x, padding, spatial, dtype):
    """Pad the spatial dims of ``x`` (NC...) by a ``[spatial, 2]`` tensor of (low, high) pairs."""
    pads = cx.node("Cast", [padding], {"to": 7})
    pads = cx.node("Reshape", [cx.node("Transpose", [pads], {"perm": [1, 0]}), cx.ints([2 * spatial])])
    zero = cx.const(np.zeros((), dtype=dtype), name="zero")
    return cx.node("Pad", [x, pads, zero, cx.ints(range(2, 2 + spatial))], {"mode": "constant"})


def _as_conv_transpose(cx, x, weights, kernel_order, lhs_dilation, strides, rhs_dilation, padding, groups, dtype):
    """A convolution over a dilated input with a constant kernel is ONNX ConvTranspose with that
    kernel flipped and its feature dims swapped (what ``lax.conv_transpose`` writes); None when the
    op is not of that form, or ConvTranspose could not pad it (padding beyond the kernel)."""
    if weights is None or all(d == 1 for d in lhs_dilation) or any(s != 1 for s in strides):
        return None
    w = np.transpose(weights, kernel_order)  # [O, C/g, k...]
    kernel = list(w.shape[2:])
    reach = [(k - 1) * d for k, d in zip(kernel, rhs_dilation)]  # the dilated kernel's extent - 1
    begins = [r - lo for r, lo in zip(reach, padding[0::2])]
    ends = [r - hi for r, hi in zip(reach, padding[1::2])]
    if min(begins + ends) < 0:
        return None
    out_features, in_per_group = w.shape[:2]
    # [g, O/g, C/g, k...] -> [g, C/g, O/g, k...]: ConvTranspose's [C, O/g, k...]
    w = w.reshape(groups, out_features // groups, in_per_group, *kernel).swapaxes(1, 2)
    w = w.reshape(groups * in_per_group, out_features // groups, *kernel)
    w = np.flip(w, axis=tuple(range(2, w.ndim))).astype(dtype.numpy())
    return cx.node("ConvTranspose", [x, cx.const(np.ascontiguousarray(w), name="weight")],
                   {"strides": list(lhs_dilation), "dilations": list(rhs_dilation), "pads": begins + ends,
                    "group": groups, "kernel_shape": kernel})
