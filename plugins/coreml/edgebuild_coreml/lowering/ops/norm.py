"""Normalisations: Batch/Instance/Layer/Group normalisation, LpNormalization, LRN, MVN.

MIL's fused ops (batch_norm, instance_norm, layer_norm) take their parameters as
constants of exact shapes; when an ONNX model passes runtime or broadcast-shaped
parameters, the same arithmetic is spelled out with reductions.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._nn_util import (
    as_float,
    fconst,
    float_np,
    per_channel,
    rank_of,
    shape_of,
    static_shape,
)
from edgebuild_coreml.lowering.ops._util import wanted
from edgebuild_coreml.lowering.registry import lowers


def _const_vector(value, x, size=None):
    """A float constant cast to x's dtype, or None if ``value`` is a runtime Var."""
    if isinstance(value, np.ndarray):
        array = value.astype(float_np(x))
        return array if size is None or array.shape == (size,) else None
    return None


def _normalise(ctx, node, x, axes, epsilon: float, tag: str = ""):
    """((x - mean) / sqrt(var + eps), mean, 1/sqrt(var + eps)) over ``axes`` (kept dims)."""
    p = f"{tag}_" if tag else ""
    mean = mb.reduce_mean(x=x, axes=axes, keep_dims=True, name=ctx.name(node, p + "mean"))
    centred = mb.sub(x=x, y=mean, name=ctx.name(node, p + "centred"))
    squared = mb.mul(x=centred, y=centred, name=ctx.name(node, p + "sq"))
    variance = mb.reduce_mean(x=squared, axes=axes, keep_dims=True, name=ctx.name(node, p + "var"))
    shifted = mb.add(x=variance, y=fconst(x, epsilon), name=ctx.name(node, p + "var_eps"))
    inv_std = mb.rsqrt(x=shifted, name=ctx.name(node, p + "inv_std"))
    return mb.mul(x=centred, y=inv_std, name=ctx.name(node, p + "normed")), mean, inv_std


def _affine(ctx, node, y, scale, bias, name):
    """y * scale + bias with numpy broadcasting (either may be None)."""
    if scale is not None:
        y = mb.mul(x=y, y=scale, name=name if bias is None else ctx.name(node, "scaled"))
    if bias is not None:
        y = mb.add(x=y, y=bias, name=name)
    if scale is None and bias is None:
        y = mb.identity(x=y, name=name)
    return y


@lowers("BatchNormalization")
def batch_normalization(ctx, node):
    """Batch norm with the given statistics, or (training_mode=1) with the batch's own."""
    if int(ctx.attr(node, "training_mode", 0)):
        return _batch_normalization_training(ctx, node)
    x = as_float(ctx.input(node, 0))
    scale, bias, mean, var = (as_float(ctx.input(node, i)) for i in range(1, 5))
    epsilon = float(ctx.attr(node, "epsilon", 1e-5))
    rank = rank_of(x)
    channels = shape_of(x)[1] if rank > 1 else None
    params = [_const_vector(p, x, channels) for p in (mean, var, scale, bias)]
    if 3 <= rank <= 5 and all(p is not None for p in params):
        return mb.batch_norm(x=x, mean=params[0], variance=params[1], gamma=params[2], beta=params[3],
                             epsilon=epsilon, name=ctx.name(node))
    # Spelled out (rank 2 inputs, runtime statistics): (x - mean) * scale / sqrt(var + eps) + bias.
    if all(isinstance(p, np.ndarray) for p in (scale, bias, mean, var)):
        factor = (scale / np.sqrt(var + epsilon)).astype(float_np(x))
        offset = (bias - mean * factor).astype(float_np(x))
        return _affine(ctx, node, x, per_channel(factor, rank), per_channel(offset, rank), ctx.name(node))
    centred = mb.sub(x=x, y=per_channel(mean, rank), name=ctx.name(node, "centred"))
    shifted = mb.add(x=per_channel(var, rank), y=fconst(x, epsilon), name=ctx.name(node, "var_eps"))
    inv_std = mb.rsqrt(x=shifted, name=ctx.name(node, "inv_std"))
    normed = mb.mul(x=centred, y=inv_std, name=ctx.name(node, "normed"))
    return _affine(ctx, node, normed, per_channel(scale, rank), per_channel(bias, rank), ctx.name(node))


def _batch_normalization_training(ctx, node):
    """training_mode=1 (opset 14+): normalise with the batch mean and (biased) variance over
    every axis but the channels, and also return the updated running statistics
    ``running * momentum + batch * (1 - momentum)``. Nothing is learnt: it is arithmetic."""
    x = as_float(ctx.input(node, 0))
    scale, bias, mean, var = (as_float(ctx.input(node, i)) for i in range(1, 5))
    epsilon = float(ctx.attr(node, "epsilon", 1e-5))
    momentum = float(ctx.attr(node, "momentum", 0.9))
    rank = rank_of(x)
    if rank < 2:
        ctx.fail(node, f"a rank-{rank} input has no channel axis to normalise per")
    axes = [a for a in range(rank) if a != 1]
    batch_mean = mb.reduce_mean(x=x, axes=axes, keep_dims=True, name=ctx.name(node, "batch_mean"))
    centred = mb.sub(x=x, y=batch_mean, name=ctx.name(node, "centred"))
    squared = mb.mul(x=centred, y=centred, name=ctx.name(node, "sq"))
    batch_var = mb.reduce_mean(x=squared, axes=axes, keep_dims=True, name=ctx.name(node, "batch_var"))
    shifted = mb.add(x=batch_var, y=fconst(x, epsilon), name=ctx.name(node, "var_eps"))
    inv_std = mb.rsqrt(x=shifted, name=ctx.name(node, "inv_std"))
    normed = mb.mul(x=centred, y=inv_std, name=ctx.name(node, "normed"))
    y = _affine(ctx, node, normed, per_channel(scale, rank), per_channel(bias, rank), ctx.name(node))
    outputs = [y]
    for k, (running, batch, tag) in enumerate(((mean, batch_mean, "running_mean"), (var, batch_var, "running_var"))):
        if k + 1 >= len(node.outputs) or not wanted(node.outputs[k + 1]):
            outputs.append(None)
            continue
        flat = mb.squeeze(x=batch, axes=axes, name=ctx.name(node, f"{tag}_batch"))
        kept = mb.mul(x=running, y=fconst(x, momentum), name=ctx.name(node, f"{tag}_kept"))
        added = mb.mul(x=flat, y=fconst(x, 1.0 - momentum), name=ctx.name(node, f"{tag}_added"))
        outputs.append(mb.add(x=kept, y=added, name=ctx.name(node, tag)))
    return tuple(outputs[: max(1, len(node.outputs))])


@lowers("InstanceNormalization")
def instance_normalization(ctx, node):
    x = as_float(ctx.input(node, 0))
    scale, bias = as_float(ctx.input(node, 1)), as_float(ctx.input(node, 2))
    epsilon = float(ctx.attr(node, "epsilon", 1e-5))
    rank = rank_of(x)
    channels = shape_of(x)[1]
    gamma, beta = _const_vector(scale, x, channels), _const_vector(bias, x, channels)
    if rank in (3, 4) and gamma is not None and beta is not None:
        return mb.instance_norm(x=x, gamma=gamma, beta=beta, epsilon=epsilon, name=ctx.name(node))
    normed, _, _ = _normalise(ctx, node, x, list(range(2, rank)), epsilon)
    return _affine(ctx, node, normed, per_channel(scale, rank), per_channel(bias, rank), ctx.name(node))


@lowers("LayerNormalization", since=17)
def layer_normalization(ctx, node):
    """Normalise over dims axis..; Mean / InvStdDev outputs are produced when asked for."""
    x = as_float(ctx.input(node, 0))
    scale = as_float(ctx.input(node, 1))
    bias = as_float(ctx.input(node, 2, optional=True))
    epsilon = float(ctx.attr(node, "epsilon", 1e-5))
    axis = int(ctx.attr(node, "axis", -1))
    wants_stats = any(o is not None and o.name != "" for o in list(node.outputs)[1:])
    return layer_norm(ctx, node, x, scale, bias, axis, epsilon, stats=wants_stats)


def layer_norm(ctx, node, x, scale, bias, axis: int, epsilon: float, *, stats: bool = False, name: str | None = None):
    """LayerNormalization's arithmetic over dims axis..: ``y``, or ``(y, mean, inv_std)`` (kept
    dims) when ``stats``. MIL's fused layer_norm when the parameters are constants of the
    normalised shape and no statistics are wanted; spelled out otherwise. ``name``: of ``y``."""
    name = name or ctx.name(node)
    rank = rank_of(x)
    axis = axis + rank if axis < 0 else axis
    axes = list(range(axis, rank))
    normalised_shape = shape_of(x)[axis:]
    gamma = scale.astype(float_np(x)) if isinstance(scale, np.ndarray) and scale.shape == normalised_shape else None
    beta = bias.astype(float_np(x)) if isinstance(bias, np.ndarray) and bias.shape == normalised_shape else None
    if not stats and gamma is not None and (bias is None or beta is not None):
        kwargs = {"beta": beta} if beta is not None else {}
        return mb.layer_norm(x=x, axes=axes, gamma=gamma, epsilon=epsilon, name=name, **kwargs)
    normed, mean, inv_std = _normalise(ctx, node, x, axes, epsilon)
    y = _affine(ctx, node, normed, scale, bias, name)
    return (y, mean, inv_std) if stats else y


@lowers("GroupNormalization", since=18, until=20)
def group_normalization_group_affine(ctx, node):
    """Before opset 21 scale and bias are per group: applied in the grouped view."""
    shape, groups, normed, scale, bias = _group_normalized(ctx, node)
    normed = _affine(ctx, node, normed, _group_param(scale, groups), _group_param(bias, groups),
                     ctx.name(node, "affine"))
    return mb.reshape(x=normed, shape=list(shape), name=ctx.name(node))


@lowers("GroupNormalization", since=21)
def group_normalization_channel_affine(ctx, node):
    """From opset 21 scale and bias are per channel: applied after restoring the shape."""
    shape, _, normed, scale, bias = _group_normalized(ctx, node)
    restored = mb.reshape(x=normed, shape=list(shape), name=ctx.name(node, "restored"))
    return _affine(ctx, node, restored, per_channel(scale, len(shape)), per_channel(bias, len(shape)), ctx.name(node))


def _group_normalized(ctx, node):
    """(input shape, groups, x normalised per (sample, group) in the [N, groups, -1] view, scale, bias)."""
    x = as_float(ctx.input(node, 0))
    scale, bias = as_float(ctx.input(node, 1)), as_float(ctx.input(node, 2))
    epsilon = float(ctx.attr(node, "epsilon", 1e-5))
    groups = int(ctx.attr(node, "num_groups"))
    shape = static_shape(x)
    if shape is None:
        ctx.fail(node, "GroupNormalization needs static input shapes to split channels into groups",
                 "pin the input shapes in the recipe")
    channels = shape[1]
    if channels % groups:
        ctx.fail(node, f"{channels} channels do not split into {groups} groups")
    grouped = mb.reshape(x=x, shape=[shape[0], groups, -1], name=ctx.name(node, "grouped"))
    normed, _, _ = _normalise(ctx, node, grouped, [2], epsilon)
    return shape, groups, normed, scale, bias


def _group_param(value, groups: int):
    if isinstance(value, np.ndarray):
        return value.reshape(1, groups, 1)
    return mb.reshape(x=value, shape=[1, groups, 1])


@lowers("LpNormalization")
def lp_normalization(ctx, node):
    """x / ||x||_p along ``axis`` (p is 1 or 2); an all-zero slice stays zero, not NaN."""
    x = as_float(ctx.input(node, 0))
    p = int(ctx.attr(node, "p", 2))
    axis = int(ctx.attr(node, "axis", -1))
    if p not in (1, 2):
        ctx.fail(node, f"p={p}: ONNX LpNormalization only defines p=1 and p=2")
    reduce = mb.reduce_l2_norm if p == 2 else mb.reduce_l1_norm
    norm = reduce(x=x, axes=[axis], keep_dims=True, name=ctx.name(node, "norm"))
    empty = mb.equal(x=norm, y=fconst(x, 0), name=ctx.name(node, "zero_norm"))
    divisor = mb.select(cond=empty, a=fconst(x, 1), b=norm, name=ctx.name(node, "safe_norm"))
    return mb.real_div(x=x, y=divisor, name=ctx.name(node))


@lowers("LRN")
def local_response_normalization(ctx, node):
    """x / (bias + alpha/size * sum of x^2 over the channel window)^beta.

    ONNX's window is [c - floor((size-1)/2), c + ceil((size-1)/2)], asymmetric for even
    sizes, so the sum is an explicit zero-padded average pool over the channel axis.
    """
    x = as_float(ctx.input(node, 0))
    size = int(ctx.attr(node, "size"))
    alpha, beta = float(ctx.attr(node, "alpha", 1e-4)), float(ctx.attr(node, "beta", 0.75))
    bias = float(ctx.attr(node, "bias", 1.0))
    shape = static_shape(x)
    if shape is None or len(shape) < 3:
        ctx.fail(node, "LRN needs a static N x C x ... input", "pin the input shapes in the recipe")
    n, c = shape[0], shape[1]
    squared = mb.mul(x=x, y=x, name=ctx.name(node, "sq"))
    planes = mb.reshape(x=squared, shape=[n, 1, c, -1], name=ctx.name(node, "planes"))
    front, back = (size - 1) // 2, size - 1 - (size - 1) // 2
    mean = mb.avg_pool(x=planes, kernel_sizes=[size, 1], strides=[1, 1], pad_type="custom",
                       pad=[front, back, 0, 0], exclude_padding_from_average=False, name=ctx.name(node, "window"))
    mean = mb.reshape(x=mean, shape=list(shape), name=ctx.name(node, "window_sum"))
    # avg_pool already divided by size: bias + alpha * mean == bias + alpha/size * sum.
    base = mb.add(x=mb.mul(x=mean, y=fconst(x, alpha), name=ctx.name(node, "scaled")), y=fconst(x, bias),
                  name=ctx.name(node, "base"))
    factor = mb.pow(x=base, y=fconst(x, -beta), name=ctx.name(node, "factor"))
    return mb.mul(x=x, y=factor, name=ctx.name(node))


@lowers("MeanVarianceNormalization", since=9)
def mean_variance_normalization(ctx, node):
    """(x - mean) / (sqrt(var) + 1e-9) over ``axes`` (default [0, 2, 3])."""
    x = as_float(ctx.input(node, 0))
    axes = [int(a) for a in ctx.attr(node, "axes", [0, 2, 3])]
    mean = mb.reduce_mean(x=x, axes=axes, keep_dims=True, name=ctx.name(node, "mean"))
    centred = mb.sub(x=x, y=mean, name=ctx.name(node, "centred"))
    squared = mb.mul(x=centred, y=centred, name=ctx.name(node, "sq"))
    variance = mb.reduce_mean(x=squared, axes=axes, keep_dims=True, name=ctx.name(node, "var"))
    std = mb.sqrt(x=variance, name=ctx.name(node, "std"))
    denominator = mb.add(x=std, y=fconst(x, 1e-9), name=ctx.name(node, "denominator"))
    return mb.real_div(x=centred, y=denominator, name=ctx.name(node))
