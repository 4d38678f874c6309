"""Neural-network ops: matmul, convolution, pooling, normalization, softmax, attention."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from edgebuild.plugin import reference
from edgebuild_mpsgraph.executor.registry import evaluates


@evaluates("matrixMultiplication")
def matmul(a, b, **_):
    return [np.matmul(a, b)]


def _pad_nchw(x, top, bottom, left, right, value=0.0):
    if not (top or bottom or left or right):
        return x
    return np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=value)


def _windows(x, kh, kw, sy, sx, dy, dx):
    """[N, C, Ho, Wo, kh, kw] views of the (padded) input under each window."""
    span_h, span_w = (kh - 1) * dy + 1, (kw - 1) * dx + 1
    view = sliding_window_view(x, (span_h, span_w), axis=(2, 3))
    return view[:, :, ::sy, ::sx, ::dy, ::dx]


@evaluates("convolution2D")
def convolution2d(x, w, *, strideInX=1, strideInY=1, dilationRateInX=1, dilationRateInY=1, groups=1,
                  paddingLeft=0, paddingRight=0, paddingTop=0, paddingBottom=0,
                  dataLayout="NCHW", weightsLayout="OIHW", **_):
    if dataLayout != "NCHW" or weightsLayout != "OIHW":
        raise ValueError("convolution2D: only NCHW data and OIHW weights are supported")
    x = _pad_nchw(x, paddingTop, paddingBottom, paddingLeft, paddingRight)
    out_channels, per_group, kh, kw = w.shape
    win = _windows(x, kh, kw, strideInY, strideInX, dilationRateInY, dilationRateInX)
    n, c, ho, wo = win.shape[:4]
    win = win.reshape(n, groups, c // groups, ho, wo, kh, kw)
    wg = w.reshape(groups, out_channels // groups, per_group, kh, kw)
    y = np.einsum("ngchwij,gocij->ngohw", win, wg, optimize=True)
    return [y.reshape(n, out_channels, ho, wo).astype(x.dtype)]


def _pool_padding(x, kh, kw, sy, sx, top, bottom, left, right, ceil_mode):
    """Extra bottom/right padding so ceil-mode windows that start inside the input are kept."""
    if not ceil_mode:
        return bottom, right
    h, w = x.shape[2] + top + bottom, x.shape[3] + left + right
    extra_h = (-(h - kh) % sy) if (h - kh) % sy else 0
    extra_w = (-(w - kw) % sx) if (w - kw) % sx else 0
    # a last window starting entirely in the padding is dropped (ONNX / MPSGraph ceil mode)
    if extra_h and (h - kh + extra_h) // sy * sy >= x.shape[2] + top:
        extra_h = 0
    if extra_w and (w - kw + extra_w) // sx * sx >= x.shape[3] + left:
        extra_w = 0
    return bottom + extra_h, right + extra_w


@evaluates("maxPooling2D")
def max_pooling2d(x, *, kernelWidth, kernelHeight, strideInX=1, strideInY=1, dilationRateInX=1, dilationRateInY=1,
                  paddingLeft=0, paddingRight=0, paddingTop=0, paddingBottom=0, ceilMode=False, dataLayout="NCHW", **_):
    bottom, right = _pool_padding(x, kernelHeight, kernelWidth, strideInY, strideInX, paddingTop, paddingBottom,
                                  paddingLeft, paddingRight, ceilMode)
    low = np.finfo(x.dtype).min if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).min
    padded = _pad_nchw(x, paddingTop, bottom, paddingLeft, right, value=low)
    win = _windows(padded, kernelHeight, kernelWidth, strideInY, strideInX, dilationRateInY, dilationRateInX)
    return [win.max(axis=(-2, -1))]


@evaluates("avgPooling2D")
def avg_pooling2d(x, *, kernelWidth, kernelHeight, strideInX=1, strideInY=1, paddingLeft=0, paddingRight=0,
                  paddingTop=0, paddingBottom=0, ceilMode=False, includeZeroPadToAverage=False, dataLayout="NCHW", **_):
    bottom, right = _pool_padding(x, kernelHeight, kernelWidth, strideInY, strideInX, paddingTop, paddingBottom,
                                  paddingLeft, paddingRight, ceilMode)
    padded = _pad_nchw(x, paddingTop, bottom, paddingLeft, right)
    total = _windows(padded, kernelHeight, kernelWidth, strideInY, strideInX, 1, 1).sum(axis=(-2, -1), dtype=np.float64)
    ones = np.ones((1, 1) + x.shape[2:], dtype=np.float64)
    if includeZeroPadToAverage:  # explicit padding counts, ceil-mode overhang does not
        ones = _pad_nchw(ones, paddingTop, paddingBottom, paddingLeft, paddingRight, value=1.0)
        ones = _pad_nchw(ones, 0, bottom - paddingBottom, 0, right - paddingRight)
    else:
        ones = _pad_nchw(ones, paddingTop, bottom, paddingLeft, right)
    count = _windows(ones, kernelHeight, kernelWidth, strideInY, strideInX, 1, 1).sum(axis=(-2, -1))
    return [(total / count).astype(x.dtype)]


@evaluates("softMax")
def softmax(x, *, axis: int, **_):
    return [reference.reductions.softmax(x, axis=axis)]


@evaluates("normalization")
def normalization(x, mean, variance, gamma, beta, *, epsilon: float, **_):
    """MPSGraph's normalizationWithTensor:meanTensor:varianceTensor:gammaTensor:betaTensor:epsilon:."""
    epsilon = np.asarray(epsilon, variance.dtype)
    return [reference.normalization.batch_normalize(x, mean, variance, epsilon, gamma, beta).astype(x.dtype, copy=False)]


@evaluates("scaledDotProductAttention")
def scaled_dot_product_attention(q, k, v, mask=None, *, scale: float, **_):
    """softmax(Q @ K^T * scale + mask) @ V, K as [..., Lk, D] (MPSGraph, macOS 15)."""
    return [reference.attention.scaled_dot_product_attention(q, k, v, mask, scale)]
