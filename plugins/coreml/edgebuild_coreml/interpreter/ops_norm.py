"""Normalization evaluators (MIL ``normalization.py``): batch, instance, layer, L2, LRN."""

from __future__ import annotations

import numpy as np

from edgebuild.plugin.reference import normalization

from ._params import as_float, ints, param, per_channel, scalar
from .registry import evaluates


def _eps(op, x, default):
    return float(scalar(param(op, x, "epsilon", default)))


def _per_channel(value, rank: int):
    return None if value is None else per_channel(as_float(value), rank)


@evaluates("batch_norm")
def batch_norm(op, x):
    v = as_float(x["x"])
    mean = per_channel(as_float(x["mean"]), v.ndim)
    variance = per_channel(as_float(x["variance"]), v.ndim)
    return normalization.batch_normalize(v, mean, variance, _eps(op, x, 1e-5),
                           _per_channel(x.get("gamma"), v.ndim), _per_channel(x.get("beta"), v.ndim))


@evaluates("instance_norm")
def instance_norm(op, x):
    v = as_float(x["x"])
    y = normalization.standardize(v, tuple(range(2, v.ndim)), _eps(op, x, 1e-5))
    return normalization.scale_and_shift(y, _per_channel(x.get("gamma"), v.ndim), _per_channel(x.get("beta"), v.ndim))


@evaluates("layer_norm")
def layer_norm(op, x):
    v = as_float(x["x"])
    axes_value = param(op, x, "axes")
    axes = tuple(range(v.ndim)) if axes_value is None else tuple(a % v.ndim for a in ints(axes_value))
    y = normalization.standardize(v, axes, _eps(op, x, 1e-5))
    # gamma/beta have shape x.shape[axes]; place them on those axes.
    affine_shape = [v.shape[i] if i in axes else 1 for i in range(v.ndim)]
    gamma, beta = x.get("gamma"), x.get("beta")
    return normalization.scale_and_shift(y, None if gamma is None else as_float(gamma).reshape(affine_shape),
                           None if beta is None else as_float(beta).reshape(affine_shape))


@evaluates("l2_norm")
def l2_norm(op, x):
    # The trailing three dims are normalized together; leading dims are batch.
    v = as_float(x["x"])
    axes = tuple(range(max(v.ndim - 3, 0), v.ndim))
    square_sum = np.sum(v * v, axis=axes, keepdims=True)
    return v / np.sqrt(square_sum + _eps(op, x, 1e-6))


@evaluates("local_response_norm")
def local_response_norm(op, x):
    v = as_float(x["x"])
    size = int(scalar(x["size"]))
    alpha = float(scalar(param(op, x, "alpha", 1e-4)))
    beta = float(scalar(param(op, x, "beta", 0.75)))
    k = float(scalar(param(op, x, "k", 1.0)))
    # Channel window [c - floor((size-1)/2), c + ceil((size-1)/2)], as in ONNX LRN.
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    squares = np.pad(v * v, [(0, 0), (before, after)] + [(0, 0)] * (v.ndim - 2))
    cumulative = np.concatenate([np.zeros_like(squares[:, :1]), np.cumsum(squares, axis=1)], axis=1)
    channels = v.shape[1]
    window_sum = cumulative[:, size : size + channels] - cumulative[:, :channels]
    return v / np.power(k + alpha / size * window_sum, beta)
