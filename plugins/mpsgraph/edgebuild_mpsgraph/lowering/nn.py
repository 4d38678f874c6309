"""Convolution, pooling, normalization, matmul, softmax, attention and resize."""

from __future__ import annotations

import numpy as np

from edgebuild.plugin import BuildError
from edgebuild_mpsgraph.lowering.registry import lowers


def _unsupported(node, what: str) -> BuildError:
    return BuildError(f"node {node.name!r} ({node.op_type}): {what} is not supported by the MPSGraph lowering",
                      hint="route this node to Core ML with target.options.prefer")


def _spatial(ctx, node, x, kernel):
    """(strides, dilations, padding top/bottom/left/right) of a 2-D window op, auto_pad resolved."""
    if len(ctx.shape(x)) != 4:
        raise _unsupported(node, f"a rank-{len(ctx.shape(x))} input (only 2-D spatial, NCHW)")
    strides = list(ctx.attr(node, "strides", [1, 1]))
    dilations = list(ctx.attr(node, "dilations", [1, 1]))
    pads = list(ctx.attr(node, "pads", [0, 0, 0, 0]))
    auto_pad = ctx.attr(node, "auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0, 0, 0, 0]
        for axis in range(2):
            size = ctx.shape(x)[2 + axis]
            out = -(-size // strides[axis])
            total = max(0, (out - 1) * strides[axis] + (kernel[axis] - 1) * dilations[axis] + 1 - size)
            small, large = total // 2, total - total // 2
            pads[axis], pads[axis + 2] = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
    elif auto_pad == "VALID":
        pads = [0, 0, 0, 0]
    return dict(strideInY=strides[0], strideInX=strides[1], dilationRateInY=dilations[0], dilationRateInX=dilations[1],
                paddingTop=pads[0], paddingLeft=pads[1], paddingBottom=pads[2], paddingRight=pads[3])


def _channel_vector(ctx, array, hint):
    """A per-channel [C] vector as a [1, C, 1, 1] constant (broadcasts over NCHW)."""
    return ctx.constant(np.asarray(array).reshape(1, -1, 1, 1), hint)


@lowers("Conv")
def lower_conv(ctx, node):
    x, w = ctx.input(node, 0), ctx.input(node, 1)
    kernel = ctx.shape(w)[2:]
    y = ctx.emit("convolution2D", [x, w], groups=int(ctx.attr(node, "group", 1)), dataLayout="NCHW",
                 weightsLayout="OIHW", **_spatial(ctx, node, x, kernel))
    if ctx.has_input(node, 2):
        bias = ctx.const(node, 2)
        bias = _channel_vector(ctx, bias, "bias") if bias is not None else \
            ctx.emit("reshape", [ctx.input(node, 2)], shape=[1, -1, 1, 1])
        y = ctx.emit("addition", [y, bias])
    return y


def _pool(ctx, node, op):
    x = ctx.input(node, 0)
    kernel = list(ctx.attr(node, "kernel_shape"))
    attrs = _spatial(ctx, node, x, kernel)
    attrs.update(kernelHeight=kernel[0], kernelWidth=kernel[1], ceilMode=bool(ctx.attr(node, "ceil_mode", 0)),
                 dataLayout="NCHW")
    if op == "avgPooling2D":
        del attrs["dilationRateInX"], attrs["dilationRateInY"]
        attrs["includeZeroPadToAverage"] = bool(ctx.attr(node, "count_include_pad", 0))
    return ctx.emit(op, [x], **attrs)


@lowers("MaxPool")
def lower_max_pool(ctx, node):
    if len(node.outputs) > 1 and node.outputs[1] is not None and node.outputs[1].uses():
        raise _unsupported(node, "the Indices output")
    return _pool(ctx, node, "maxPooling2D")


@lowers("AveragePool")
def lower_average_pool(ctx, node):
    return _pool(ctx, node, "avgPooling2D")


@lowers("GlobalAveragePool")
def lower_global_average_pool(ctx, node):
    x = ctx.input(node, 0)
    return ctx.emit("mean", [x], axes=list(range(2, len(ctx.shape(x)))))


@lowers("GlobalMaxPool")
def lower_global_max_pool(ctx, node):
    x = ctx.input(node, 0)
    return ctx.emit("reductionMaximum", [x], axes=list(range(2, len(ctx.shape(x)))))


@lowers("BatchNormalization")
def lower_batch_norm(ctx, node):
    x = ctx.input(node, 0)
    params = [ctx.const(node, i) for i in range(1, 5)]
    if any(p is None for p in params):
        raise _unsupported(node, "run-time scale/bias/mean/variance")
    scale, bias, mean, var = params
    rank = len(ctx.shape(x))
    shape = [1, -1] + [1] * (rank - 2)
    mean_t, var_t, gamma_t, beta_t = (ctx.constant(np.asarray(p).reshape(shape), hint)
                                      for p, hint in ((mean, "mean"), (var, "variance"), (scale, "gamma"), (bias, "beta")))
    return ctx.emit("normalization", [x, mean_t, var_t, gamma_t, beta_t], epsilon=float(ctx.attr(node, "epsilon", 1e-5)))


@lowers("LayerNormalization")
def lower_layer_norm(ctx, node):
    x = ctx.input(node, 0)
    rank = len(ctx.shape(x))
    axis = ctx.attr(node, "axis", -1) % rank
    axes = list(range(axis, rank))
    mean = ctx.emit("mean", [x], axes=axes)
    variance = ctx.emit("variance", [x], axes=axes)
    gamma = ctx.input(node, 1)
    beta = ctx.input(node, 2) if ctx.has_input(node, 2) else ctx.scalar(0.0, x)
    return ctx.emit("normalization", [x, mean, variance, gamma, beta], epsilon=float(ctx.attr(node, "epsilon", 1e-5)))


@lowers("Softmax", until=12)
def lower_softmax_flattened(ctx, node):
    """Before opset 13 Softmax flattens to 2-D at ``axis`` (default 1) and normalises the rows."""
    x = ctx.input(node, 0)
    rank = len(ctx.shape(x))
    axis = ctx.attr(node, "axis", 1) % rank
    if axis == rank - 1:
        return ctx.emit("softMax", [x], axis=axis)
    flat = ctx.emit("reshape", [x], shape=[int(np.prod(ctx.shape(x)[:axis])), -1])
    return ctx.emit("reshape", [ctx.emit("softMax", [flat], axis=1)], shape=list(ctx.shape(x)))


@lowers("Softmax", since=13)
def lower_softmax(ctx, node):
    x = ctx.input(node, 0)
    return ctx.emit("softMax", [x], axis=ctx.attr(node, "axis", -1) % len(ctx.shape(x)))


@lowers("MatMul")
def lower_matmul(ctx, node):
    return ctx.emit("matrixMultiplication", [ctx.input(node, 0), ctx.input(node, 1)])


@lowers("Linear", domain="edgebuild")
def lower_linear(ctx, node):
    y = ctx.emit("matrixMultiplication", [ctx.input(node, 0), ctx.input(node, 1)])
    return ctx.emit("addition", [y, ctx.input(node, 2)]) if ctx.has_input(node, 2) else y


@lowers("Gemm")
def lower_gemm(ctx, node):
    a, b = ctx.input(node, 0), ctx.input(node, 1)
    if ctx.attr(node, "transA", 0):
        a = ctx.emit("transpose", [a], permutation=[1, 0])
    if ctx.attr(node, "transB", 0):
        b = ctx.emit("transpose", [b], permutation=[1, 0])
    y = ctx.emit("matrixMultiplication", [a, b])
    alpha, beta = float(ctx.attr(node, "alpha", 1.0)), float(ctx.attr(node, "beta", 1.0))
    if alpha != 1.0:
        y = ctx.emit("multiplication", [y, ctx.scalar(alpha, y)])
    if ctx.has_input(node, 2):
        c = ctx.input(node, 2)
        if beta != 1.0:
            c = ctx.emit("multiplication", [c, ctx.scalar(beta, c)])
        y = ctx.emit("addition", [y, c])
    return y


@lowers("ScaledDotProductAttention", domain="edgebuild")
def lower_attention(ctx, node):
    inputs = [ctx.input(node, i) for i in range(3)]
    if ctx.has_input(node, 3):
        inputs.append(ctx.input(node, 3))
    return ctx.emit("scaledDotProductAttention", inputs, scale=float(ctx.attr(node, "scale", 1.0)))


@lowers("Resize", since=11)
def lower_resize(ctx, node):
    x = ctx.input(node, 0)
    shape = ctx.shape(x)
    if len(shape) != 4:
        raise _unsupported(node, "a non-4-D input")
    sizes = ctx.const(node, 3) if ctx.has_input(node, 3) else None
    scales = ctx.const(node, 2) if ctx.has_input(node, 2) else None
    if sizes is not None and sizes.size:
        out = [int(s) for s in sizes]
    elif scales is not None and scales.size:
        out = [int(np.floor(d * s)) for d, s in zip(shape, scales)]
    else:
        raise _unsupported(node, "run-time scales or sizes")
    if out[:2] != list(shape[:2]):
        raise _unsupported(node, "resizing the batch or channel axis")
    mode = ctx.attr(node, "mode", "nearest")
    transform = ctx.attr(node, "coordinate_transformation_mode", "half_pixel")
    nearest_mode = ctx.attr(node, "nearest_mode", "round_prefer_floor")
    integer_upscale = all(o % i == 0 for o, i in zip(out[2:], shape[2:]))
    if mode == "nearest":
        # floor(dst * in/out) — what asymmetric+floor computes, and half_pixel+round on integer upscales
        if (transform == "asymmetric" and nearest_mode == "floor") or (
                transform in ("half_pixel", "pytorch_half_pixel", "asymmetric") and integer_upscale
                and nearest_mode in ("round_prefer_floor", "floor")):
            return ctx.emit("resizeTensor", [x], size=out[2:], mode="nearest", centerResult=False,
                            alignCorners=False, layout="NCHW")
    elif mode == "linear" and transform in ("half_pixel", "align_corners", "pytorch_half_pixel"):
        if transform != "pytorch_half_pixel" or all(o > 1 for o in out[2:]):
            return ctx.emit("resizeTensor", [x], size=out[2:], mode="bilinear",
                            centerResult=transform != "align_corners", alignCorners=transform == "align_corners",
                            layout="NCHW")
    raise _unsupported(node, f"mode {mode!r} with coordinate_transformation_mode {transform!r}")
