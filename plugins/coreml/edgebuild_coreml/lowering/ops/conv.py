"""Conv, ConvInteger and ConvTranspose (1-D/2-D/3-D, groups, dilations, every auto_pad).

Pads are always made explicit when the spatial input shape is known, so ONNX's SAME_UPPER /
SAME_LOWER arithmetic is applied exactly instead of relying on MIL's "same" rule.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil.types.symbolic import is_symbolic

from edgebuild_coreml.lowering.ops._nn_util import (
    as_float,
    float_np,
    mil_pads,
    per_channel,
    rank_of,
    same_pads,
    shape_of,
    static_shape,
)
from edgebuild_coreml.lowering.registry import lowers


def _geometry(ctx, node, kernel_shape):
    n = len(kernel_shape)
    strides = [int(s) for s in ctx.attr(node, "strides", [1] * n)]
    dilations = [int(d) for d in ctx.attr(node, "dilations", [1] * n)]
    return strides, dilations


def _bias(ctx, node, x, index: int):
    """Constant bias for the MIL op, or (None, runtime Var) to add afterwards."""
    bias = as_float(ctx.input(node, index, optional=True))
    if bias is None or isinstance(bias, np.ndarray):
        return (None if bias is None else bias.astype(float_np(x))), None
    return None, bias


def _add_bias_after(ctx, node, y, bias_var, rank):
    if bias_var is None:
        return y
    return mb.add(x=y, y=per_channel(bias_var, rank), name=ctx.name(node))


@lowers("Conv")
def conv(ctx, node):
    x, weight = as_float(ctx.input(node, 0)), as_float(ctx.input(node, 1))
    bias, late_bias = _bias(ctx, node, x, 2)
    return _float_conv(ctx, node, x, weight, bias, late_bias, ctx.name(node))


def _float_conv(ctx, node, x, weight, bias, late_bias, name: str):
    """MIL conv with ``node``'s geometry attributes (Conv and ConvInteger share them)."""
    rank = rank_of(x)
    if not 3 <= rank <= 5:
        ctx.fail(node, f"Core ML conv supports 1-D to 3-D convolutions; the input has rank {rank}")
    kernel = [int(k) for k in shape_of(weight)[2:]]
    strides, dilations = _geometry(ctx, node, kernel)
    groups = int(ctx.attr(node, "group", 1))
    auto_pad = ctx.attr(node, "auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    spatial = shape_of(x)[2:]
    static = all(isinstance(d, (int, np.integer)) for d in spatial)

    pad_type, pad = "custom", None
    if auto_pad == "NOTSET":
        pad = mil_pads(ctx.attr(node, "pads", [0] * 2 * len(kernel)))
    elif auto_pad == "VALID":
        pad_type = "valid"
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if static:
            pad = mil_pads(same_pads([int(s) for s in spatial], kernel, strides, dilations, auto_pad == "SAME_UPPER"))
        else:
            pad_type = "same" if auto_pad == "SAME_UPPER" else "same_lower"
            if pad_type == "same_lower":
                ctx.require_target(node, "iOS16", "SAME_LOWER padding on dynamic shapes")
    else:
        ctx.fail(node, f"unknown auto_pad {auto_pad!r}")

    if isinstance(weight, np.ndarray):
        weight = weight.astype(float_np(x))
    kwargs = dict(x=x, weight=weight, strides=strides, dilations=dilations, groups=groups, pad_type=pad_type)
    if pad is not None:
        kwargs["pad"] = pad
    if bias is not None:
        kwargs["bias"] = bias
    y = mb.conv(**kwargs, name=name if late_bias is None else ctx.name(node, "conv"))
    return _add_bias_after(ctx, node, y, late_bias, rank)


def _centred_float(ctx, node, index: int, zero_index: int, what: str, per_output_channel: bool):
    """Integer input ``index`` minus its zero point, as fp32 (a weight's zero point may be per output channel)."""
    x = ctx.input(node, index)
    zero = ctx.input(node, zero_index, optional=True)
    if isinstance(x, np.ndarray):
        values = x.astype(np.float32)
        if zero is not None and not isinstance(zero, np.ndarray):
            values = mb.const(val=values, name=ctx.name(node, what))
    else:
        values = mb.cast(x=x, dtype="fp32", name=ctx.name(node, what))
    if zero is None:
        return values
    if isinstance(zero, np.ndarray):
        zero = zero.astype(np.float32)
        if per_output_channel and zero.size > 1:
            zero = zero.reshape([-1] + [1] * (rank_of(values) - 1))
        if isinstance(values, np.ndarray):
            return values - zero
        return mb.sub(x=values, y=zero.reshape(()) if zero.size == 1 else zero, name=ctx.name(node, what + "_centred"))
    zero = mb.cast(x=zero, dtype="fp32", name=ctx.name(node, what + "_zp"))
    if per_output_channel and rank_of(zero) == 1:
        zero = mb.reshape(x=zero, shape=[-1] + [1] * (rank_of(values) - 1), name=ctx.name(node, what + "_zp_view"))
    return mb.sub(x=values, y=zero, name=ctx.name(node, what + "_centred"))


@lowers("ConvInteger", since=10)
def conv_integer(ctx, node):
    """(x - x_zero_point) conv (w - w_zero_point) as int32, as ONNX specifies.

    Core ML convolves floats only: the centred integers are convolved in fp32, which is exact
    while every partial sum stays below 2**24 (e.g. up to 258 products of full-range uint8 values
    per output). quantize_dynamic's ConvInteger -> Cast -> Mul graphs never get here: the
    decompose_dynamic_quant pass turns them into DequantizeLinear + float Conv.
    """
    x = _centred_float(ctx, node, 0, 2, "x", per_output_channel=False)
    weight = _centred_float(ctx, node, 1, 3, "w", per_output_channel=True)
    y = _float_conv(ctx, node, x, weight, None, None, ctx.name(node, "float"))
    rounded = mb.round(x=y, name=ctx.name(node, "rounded"))
    return mb.cast(x=rounded, dtype="int32", name=ctx.name(node))


def _transpose_pads(ctx, node, in_sizes, kernel, strides, dilations):
    """(pad_begin, pad_end, output_padding) per spatial axis, following ONNX ConvTranspose."""
    n = len(kernel)
    output_padding = [int(p) for p in ctx.attr(node, "output_padding", [0] * n)]
    output_shape = ctx.attr(node, "output_shape")
    auto_pad = ctx.attr(node, "auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    full = [s * (i - 1) + (k - 1) * d + 1 for i, k, s, d in zip(in_sizes, kernel, strides, dilations)]
    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if output_shape is not None:
            targets = [int(v) for v in output_shape][-n:]
        else:
            targets = [i * s for i, s in zip(in_sizes, strides)]
        begins, ends = [], []
        for f, p, t in zip(full, output_padding, targets):
            total = f + p - t
            small, big = total // 2, total - total // 2
            # SAME_UPPER puts the odd pixel at the end of the *input* of the matching
            # conv, i.e. at the beginning of the transposed output.
            if auto_pad == "SAME_UPPER":
                begins.append(small), ends.append(big)
            else:
                begins.append(big), ends.append(small)
        return begins, ends, output_padding
    if auto_pad == "VALID":
        return [0] * n, [0] * n, output_padding
    pads = [int(p) for p in ctx.attr(node, "pads", [0] * 2 * n)]
    return pads[:n], pads[n:], output_padding


@lowers("ConvTranspose")
def conv_transpose(ctx, node):
    """Transposed conv with no padding, then crop pads / zero-extend output_padding, then bias.

    MIL's conv_transpose cannot express output_padding or asymmetric trimming directly, so
    the full output is cut to ONNX's window explicitly.
    """
    x, weight = as_float(ctx.input(node, 0)), as_float(ctx.input(node, 1))
    rank = rank_of(x)
    # Pads and output_padding depend on the spatial dims only: the batch (a detector's roi count,
    # known at run time) may stay symbolic, and the crop below keeps the first two axes whole.
    spatial = [int(d) for d in shape_of(x)[2:] if not is_symbolic(d)]
    if rank < 3 or len(spatial) != rank - 2:
        ctx.fail(node, f"ConvTranspose needs static spatial input dims to place pads and output_padding "
                       f"(the input is {list(shape_of(x))})", "pin the input shapes in the recipe")
    if not isinstance(weight, np.ndarray):
        ctx.fail(node, "the weight must be a constant: MIL conv_transpose takes a const weight",
                 "make the weight an initializer")
    kernel = [int(k) for k in weight.shape[2:]]
    strides, dilations = _geometry(ctx, node, kernel)
    groups = int(ctx.attr(node, "group", 1))
    begins, ends, output_padding = _transpose_pads(ctx, node, spatial, kernel, strides, dilations)
    bias, late_bias = _bias(ctx, node, x, 2)
    weight = weight.astype(float_np(x))

    simple = all(p == 0 for p in output_padding) and all(b >= 0 and e >= 0 for b, e in zip(begins, ends))
    if simple:
        kwargs = dict(x=x, weight=weight, strides=strides, dilations=dilations, groups=groups,
                      pad_type="custom", pad=mil_pads(begins + ends))
        if bias is not None:
            kwargs["bias"] = bias
        y = mb.conv_transpose(**kwargs, name=ctx.name(node) if late_bias is None else ctx.name(node, "deconv"))
        return _add_bias_after(ctx, node, y, late_bias, rank)

    y = mb.conv_transpose(x=x, weight=weight, strides=strides, dilations=dilations, groups=groups,
                          pad_type="valid", name=ctx.name(node, "full"))
    # the unpadded output length per axis, then ONNX's: full + output_padding - begin - end
    full = [s * (i - 1) + (k - 1) * d + 1 for i, k, s, d in zip(spatial, kernel, strides, dilations)]
    stops = [f + p - e for f, p, e in zip(full, output_padding, ends)]
    keep_whole = [True, True] + [False] * len(full)  # batch and channels, whatever their size
    y = mb.slice_by_index(x=y, begin=[0, 0] + [max(b, 0) for b in begins],
                          end=[0, 0] + [min(s, f) for s, f in zip(stops, full)],
                          begin_mask=keep_whole, end_mask=keep_whole, name=ctx.name(node, "crop"))
    extend_front = [max(-b, 0) for b in begins]
    extend_back = [max(s - f, 0) for s, f in zip(stops, full)]
    if any(extend_front) or any(extend_back):
        pad = [0, 0, 0, 0] + mil_pads(extend_front + extend_back)
        y = mb.pad(x=y, pad=pad, mode="constant", constant_val=0.0, name=ctx.name(node, "extend"))
    if bias is not None:
        return mb.add(x=y, y=per_channel(bias, rank), name=ctx.name(node))
    if late_bias is not None:
        return _add_bias_after(ctx, node, y, late_bias, rank)
    return mb.identity(x=y, name=ctx.name(node))
