"""Convolution evaluators: ``conv`` and ``conv_transpose`` (1-D, 2-D and 3-D)."""

from __future__ import annotations

import itertools
import math
import string
from functools import partial

import numpy as np
from numpy.lib.stride_tricks import as_strided

from . import ort_kernels
from . import torch_kernels as kernels
from .fusion import Activation, apply_in_place
from ._params import as_float, channel_bias, ints, param, per_channel, per_op, scalar
from ._scratch import scratch
from ._windows import (
    effective_kernel,
    explicit_pads,
    output_sizes,
    padded_rows,
    windows,
)
from .registry import evaluates

TILE_ELEMENTS = 1 << 20  # gathered window values per matmul (4 MB in float32)


def _spatial_params(op, x, nd):
    strides = ints(param(op, x, "strides", [1] * nd))
    dilations = ints(param(op, x, "dilations", [1] * nd))
    groups = int(scalar(param(op, x, "groups", 1)))
    pad_type = str(scalar(param(op, x, "pad_type", "valid")))
    pad = param(op, x, "pad", [0] * 2 * nd)
    return strides, dilations, groups, pad_type, pad


_GEOMETRY_PARAMS = ("strides", "dilations", "groups", "pad_type", "pad")


def _geometry(op, x, in_shape, weight_shape):
    """(strides, dilations, groups, (before, after) pads, output sizes) of ``op`` on an input of
    ``in_shape`` (worked out once per op and shape: see ``_conv_call``)."""
    nd = len(in_shape) - 2
    strides, dilations, groups, pad_type, pad = _spatial_params(op, x, nd)
    eff = effective_kernel(list(weight_shape[2:]), dilations)
    pads = explicit_pads(pad_type, in_shape[2:], eff, strides, pad)
    return strides, dilations, groups, pads, output_sizes(in_shape[2:], eff, strides, pads)


def _add_bias(out: np.ndarray, bias) -> np.ndarray:
    """``out + bias`` per channel; in place (``out`` is always a fresh array here) when the
    result type is ``out``'s own."""
    if bias is None:
        return out
    b = per_channel(as_float(bias), out.ndim)
    if np.result_type(out, b) != out.dtype:
        return out + b
    out += b
    return out


def _conv_call(op, x, inp, weight, bias, activation: Activation | None = None, onnxruntime: bool = False):
    """``value -> conv(value)`` for inputs of ``inp``'s shape and type, ``activation`` applied to
    its result (see ``fusion``): what depends only on the op's constants and that shape (its
    geometry, the kernel that computes it, torch's tensors, the bias's channel shape) is worked
    out here, once per op, as it costs a small conv about as much as its arithmetic.
    ``onnxruntime``: onnxruntime's kernel may compute it (``ort_kernels``: a session holding the
    weights, for a caller whose weights stay the same every run)."""
    strides, dilations, groups, pads, out_sizes = _geometry(op, x, inp.shape, weight.shape)
    kernel = list(weight.shape[2:])
    pointwise = groups == 1 and all(k == 1 for k in kernel) and not any(b or a for b, a in pads)
    if (not pointwise or _pointwise_work(inp.shape, weight.shape, out_sizes) >= TORCH_POINTWISE_MIN_MACS) and (
            inp.shape[0] and weight.shape[0] and all(out_sizes)):
        fused = _torch_activation(activation)
        prepared = kernels.conv2d_prepared(weight, bias, strides, dilations, pads, groups, fused, inp.shape)
        if prepared is not None and inp.ndim == 4 and inp.dtype == np.float32:
            call = partial(kernels.conv2d, prepared=prepared)
            return call if fused is not None else _then(call, activation)
        if onnxruntime and inp.dtype == np.float32 and np.result_type(inp, weight) == np.float32:
            call = ort_kernels.conv_call(inp.shape, weight, bias, strides, dilations, groups, pads)
            if call is not None:
                return _then(call, activation)
    call = _numpy_conv_call(inp, weight, bias, strides, dilations, groups, pads, out_sizes, pointwise)
    return _then(call, activation)


#: multiply-adds of a 1x1 conv below which numpy's matrix product is as fast as oneDNN's call (its setup
#: costs ~20 us; a squeeze-and-excite's 1x1 convs of one pixel stay one matrix-vector product)
TORCH_POINTWISE_MIN_MACS = 1 << 21


def _pointwise_work(in_shape, weight_shape, out_sizes) -> int:
    return int(np.prod(out_sizes, dtype=np.int64)) * in_shape[0] * weight_shape[0] * weight_shape[1]


def _torch_activation(activation: Activation | None) -> str | None:
    """The name ``torch_kernels.conv2d_prepared`` fuses ``activation`` by, or None: oneDNN's
    hard-swish has MIL's lowering's constants (1/6, 1/2) and no others."""
    if activation is None or activation.kind not in kernels.FUSED_ACTIVATIONS or not kernels.fuses_activations():
        return None
    if activation.kind == "hard_swish" and (activation.alpha, activation.beta) != _ONEDNN_HARD_SWISH:
        return None
    return activation.kind


_ONEDNN_HARD_SWISH = (float(np.float32(1 / 6)), 0.5)


def _then(call, activation: Activation | None):
    """``call``, then ``activation`` written over its result (a fresh array, the conv's own)."""
    if activation is None:
        return call
    return lambda value: apply_in_place(activation, call(value))


def _numpy_conv_call(inp, weight, bias, strides, dilations, groups, pads, out_sizes, pointwise):
    """``value -> conv(value)`` by numpy's kernels (see ``conv``)."""
    kernel = list(weight.shape[2:])
    n, c_in = inp.shape[:2]
    c_out = weight.shape[0]
    out_shape, out_dtype = (n, c_out, *out_sizes), np.result_type(inp, weight)
    if pointwise and inp.size == n * c_in and n == 1 and c_out:
        return _single_pixel_call(weight, bias, out_shape, out_dtype)
    if groups == 1 and not pointwise and n and c_out and all(out_sizes) and _few_pixels(n, c_in, out_sizes, kernel):
        return _pixel_rows_call(inp.shape, weight, bias, strides, dilations, pads, out_sizes, out_dtype)
    laid_out = np.empty(out_shape, out_dtype)  # what the kernels' choice reads: the output's shape
    if not laid_out.size:
        compute = None
    elif pointwise:
        def compute(value, out):
            _pointwise(value, weight, strides, out)
    elif c_in == groups and c_out == groups:
        compute = _depthwise_call(inp.shape, weight, strides, dilations, pads, out_sizes, out_dtype)
    elif n * c_in * int(np.prod(out_sizes, dtype=np.int64)) >= IM2COL_TAP_MIN_ELEMENTS:
        placements = _tap_placements(inp.shape, weight.shape, out_sizes, strides, dilations, pads)

        def compute(value, out):
            _im2col(value, weight, strides, dilations, pads, groups, out, placements)
    else:
        def compute(value, out):
            _im2col_windows(value, weight, strides, dilations, pads, groups, out)
    shaped, in_place = (None, True) if bias is None else channel_bias(bias, laid_out)

    by_pixel = _pixels_by_channels(weight, bias, out_shape, out_dtype) if pointwise and all(
        s == 1 for s in strides) and laid_out.size else None

    def call(value):
        if by_pixel is not None and kernels.channels_last(value):
            return by_pixel(value)
        out = np.empty(out_shape, out_dtype)
        if compute is not None:
            compute(value, out)
        if shaped is None:
            return out
        if not in_place:
            return out + shaped
        out += shaped
        return out

    return call


@evaluates("conv")
def conv(op, x, activation: Activation | None = None):
    """Convolution as matrix products: a 1x1 conv is one ``numpy.matmul`` over the input as it
    is; any other gathers its windows (im2col) a band of output rows at a time, so the gathered
    copy stays within ``TILE_ELEMENTS`` however large the image; a depthwise conv (one input
    channel per output channel) gathers them too and sums each channel's taps by a batched matmul
    (``_depthwise_call``).
    Where torch's kernels are enabled (``torch_kernels``), every 2-D conv but a small 1x1 one
    (``TORCH_POINTWISE_MIN_MACS``) is its, channels last, bias and a ReLU or hard-swish after it
    included; else, in the calls of a ``ort_kernels.for_calls`` block (the validate stage's, the
    fp16 guard's), those float32 convs whose weights are the program's constants are
    onnxruntime's. The call for the op's constants and the
    input's shape is made once per op (``_conv_call``). ``activation``: one the compiled plan
    fused into the conv (``fusion``), applied to its result."""
    inp, call = _input_and_call(op, x, activation, constant_weights=ort_kernels.active() and _constant_weights(op))
    return call(inp)


def _constant_weights(op) -> bool:
    """Whether ``op``'s weight (and bias) are the program's constants: the same arrays every run,
    so a session holding them is made once (a weight computed at run time would make one a run)."""
    inputs = getattr(op, "inputs", {})
    return all(inputs[name].val is not None for name in ("weight", "bias") if name in inputs)


def _input_and_call(op, x, activation: Activation | None, constant_weights: bool = False):
    inp, weight, bias = as_float(x["x"]), as_float(x["weight"]), x.get("bias")
    onnxruntime = constant_weights and ort_kernels.active()
    call = per_op(op, "_edgebuild_conv_call", (weight, bias, *map(x.get, _GEOMETRY_PARAMS)),
                  (inp.shape, inp.dtype, kernels.enabled(), onnxruntime, activation),
                  lambda: _conv_call(op, x, inp, weight, bias, activation, onnxruntime))
    return inp, call


def _prepare(op, x, activation: Activation | None = None):
    """``input -> conv(...)`` for these args, for a caller that keeps it while the op's constants
    stay the same objects and its float32 (or fp16, widened as ``conv`` widens it) input keeps
    its type and shape (the compiled plan); None for another input type."""
    dtype = getattr(x["x"], "dtype", None)
    if dtype not in (np.float32, np.float16):
        return None
    call = _input_and_call(op, x, activation, constant_weights=True)[1]
    return call if dtype == np.float32 else lambda value: call(as_float(value))


conv.takes_activation = True  # the compiled plan may hand it one (see fusion)
conv.prepare = _prepare


def _single_pixel_call(weight, bias, out_shape, dtype):
    """``value -> conv(value)`` of a 1x1 conv of one pixel of one sample (a squeeze-and-excite's):
    one matrix-vector product, its bias added in place; the general path's reshapes, slicing and
    broadcast add cost it several times its arithmetic."""
    matrix = np.ascontiguousarray(weight.reshape(weight.shape[0], -1), dtype=dtype)  # [F, C]
    b = None if bias is None else as_float(bias).reshape(-1)

    def call(value):
        return _plus_last_axis(matrix @ value.reshape(-1), b).reshape(out_shape)

    return call


def _pointwise(inp, weight, strides, out):
    """1x1 kernel, no padding: ``weight [F, C] @ input [N, C, pixels]``."""
    n, c_in = inp.shape[:2]
    picked = inp[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)]
    np.matmul(weight.reshape(weight.shape[0], c_in), picked.reshape(n, c_in, -1), out=out.reshape(n, out.shape[1], -1))


def _plus_last_axis(product: np.ndarray, bias) -> np.ndarray:
    """``product + bias`` along its last axis (channels last); in place (``product`` is a fresh
    array) when the result type is its own."""
    if bias is None:
        return product
    if np.result_type(product, bias) != product.dtype:
        return product + bias
    product += bias
    return product


def _pixels_by_channels(weight, bias, out_shape, dtype):
    """``value -> conv(value)`` of a stride-1 1x1 conv on a channels-last input (a depthwise
    conv's result): ``[N, pixels, C] @ weight [C, F]``, a view of the input as it lies, its result
    ``[N, pixels, F]`` returned channels last in turn (``[N, F, *spatial]`` shape). The transposed
    weight is made at the first such input: most 1x1 convs never see one."""
    n, c_out, spatial = out_shape[0], out_shape[1], out_shape[2:]
    nd = len(spatial)
    to_pixels, back = (0, *range(2, 2 + nd), 1), (0, nd + 1, *range(1, nd + 1))
    made: list = []  # [(weight [C, F], bias [F] or None)] once made

    def call(value):
        if not made:
            made.append((np.ascontiguousarray(weight.reshape(c_out, -1).T, dtype=dtype),
                         None if bias is None else as_float(bias).reshape(-1)))
        w_t, b = made[0]
        product = np.matmul(value.transpose(to_pixels).reshape(n, -1, w_t.shape[0]), w_t)
        product = _plus_last_axis(product, b)
        return product.reshape(n, *spatial, c_out).transpose(back)

    return call


def _bands(out_sizes, row_elements):
    """[start, stop) ranges of output rows (first spatial dim) whose work fits in a tile."""
    rows = max(1, TILE_ELEMENTS // max(row_elements, 1))
    for start in range(0, out_sizes[0], rows):
        yield start, min(start + rows, out_sizes[0])


def _band_windows(inp, pads, out_sizes, kernel, strides, dilations, start, stop):
    """Windows ``[N, C, rows, *O_rest, *K]`` (a strided view) of output rows ``[start, stop)``."""
    padded = padded_rows(inp, pads, out_sizes, effective_kernel(kernel, dilations), strides, start, stop)
    return windows(padded, kernel, strides, dilations, [stop - start, *out_sizes[1:]])


# Output pixels' worth of gathered windows per band of ``_im2col``: one buffer of this size (1 MB
# in float32) is filled and multiplied band after band, so it stays in cache and its pages are
# touched once per conv (the build maps every large block afresh, and a fresh page costs a fault).
IM2COL_BAND_ELEMENTS = 1 << 18


def _tap_placements(in_shape, weight_shape, out_sizes, strides, dilations, pads) -> list:
    """``_tap_placement`` of every kernel tap, in ``_im2col``'s order: they depend on the
    geometry alone, so a conv's call works them out once."""
    return [_tap_placement(in_shape[2:], list(out_sizes[1:]), tap, strides, dilations, pads)
            for tap in itertools.product(*(range(k) for k in weight_shape[2:]))]


def _im2col(inp, weight, strides, dilations, pads, groups, out, placements=None):
    """Windows gathered one kernel tap at a time into a ``[N, C, K, rows, *O_rest]`` band (rows
    of the matrix are (channel, tap), as weight's ``[Cg, *K]`` flattens; columns the output
    pixels), each tap a strided copy of the input itself: no padded copy, and no 6-D transposed
    copy, which numpy does an element at a time. The product goes straight into ``out``.
    ``placements``: ``_tap_placements`` of this geometry, when worked out already."""
    n, c_in = inp.shape[:2]
    c_out, kernel = out.shape[1], list(weight.shape[2:])
    out_sizes, rest_sizes = list(out.shape[2:]), list(out.shape[3:])
    taps = list(itertools.product(*(range(k) for k in kernel)))
    rest = int(np.prod(rest_sizes, dtype=np.int64))
    w = weight.reshape(groups, c_out // groups, (c_in // groups) * len(taps))  # [G, Fg, Cg*K]
    out_columns = out.reshape(n, groups, c_out // groups, out_sizes[0] * rest)
    band_rows = max(1, min(out_sizes[0], IM2COL_BAND_ELEMENTS // max(n * c_in * len(taps) * rest, 1)))
    # zeros: where a tap reads the padding of the dims after the first, every band leaves them be
    cols = np.zeros((n, c_in, len(taps), band_rows, *rest_sizes), out.dtype)
    matrix = cols.reshape(n, groups, w.shape[2], band_rows * rest)  # a shorter last band: its leading columns
    if placements is None:
        placements = _tap_placements(inp.shape, weight.shape, out_sizes, strides, dilations, pads)
    for start in range(0, out_sizes[0], band_rows):
        stop = min(start + band_rows, out_sizes[0])
        for index, placement in enumerate(placements):
            if placement is not None:
                _gather_rows(inp, cols[:, :, index], placement, start, stop)
        np.matmul(w, matrix[..., :(stop - start) * rest], out=out_columns[..., start * rest:stop * rest])


def _tap_placement(in_sizes, rest_sizes, tap, strides, dilations, pads):
    """Where kernel tap ``tap`` reads: (its first dim's offset and stride, the output slices of
    the other dims inside the input, the input slices they read); None if it reads only padding there.
    Output position o of a dim reads input position o * stride + offset."""
    offsets = [t * d - before for t, d, (before, _) in zip(tap, dilations, pads)]
    inside, source = [], []
    for size, out_size, stride, offset in zip(in_sizes[1:], rest_sizes, strides[1:], offsets[1:]):
        lo, hi = _inside(0, out_size, stride, offset, size)
        if hi == lo:
            return None
        inside.append(slice(lo, hi))
        source.append(slice(lo * stride + offset, (hi - 1) * stride + offset + 1, stride))
    return offsets[0], strides[0], tuple(inside), tuple(source)


def _inside(begin, end, stride, offset, size):
    """Output positions [lo, hi) within [begin, end) that read inside an input dim of ``size``."""
    lo = min(end, max(begin, -(offset // stride)))
    return lo, max(lo, min(end, (size - 1 - offset) // stride + 1))


def _gather_rows(inp, dst, placement, start, stop):
    """``dst [N, C, rows, *O_rest]`` = the input under one tap for output rows ``[start, stop)``;
    zeros in the rows that read the first dim's padding."""
    offset, stride, inside, source = placement
    lo, hi = _inside(start, stop, stride, offset, inp.shape[2])
    every = (slice(None), slice(None))
    if hi > lo:
        rows = slice(lo * stride + offset, (hi - 1) * stride + offset + 1, stride)
        dst[every + (slice(lo - start, hi - start),) + inside] = inp[every + (rows,) + source]
    if lo > start:
        dst[:, :, :lo - start] = 0
    if hi < stop:
        dst[:, :, hi - start:stop - start] = 0


# Elements one kernel tap gathers (over the whole output) below which ``_im2col`` would spend more
# in a numpy call per tap than it saves: a 1-D conv of a short frame with 256 taps, say.
IM2COL_TAP_MIN_ELEMENTS = 4096


def _few_pixels(n, c_in, out_sizes, kernel) -> bool:
    """Whether a conv is one of a batch of small maps (a few pixels per sample, silero_vad's
    frames) for ``_pixel_rows_call``: one gathered matrix of every window, within one im2col
    band. A single sample's conv keeps the other paths, whose product has as many columns."""
    pixels = int(np.prod(out_sizes, dtype=np.int64))
    return (n > 1 and pixels <= SMALL_MAP_PIXELS
            and n * pixels * c_in * int(np.prod(kernel, dtype=np.int64)) <= IM2COL_BAND_ELEMENTS)


def _pixel_rows_call(in_shape, weight, bias, strides, dilations, pads, out_sizes, dtype):
    """``value -> conv(value)`` for a small map of one group: every window gathered by one copy
    into a ``[N * pixels, C * K]`` matrix (rows the output pixels of every sample, so a batch of
    short frames is one matrix product, not one per sample with a few columns) times the weight
    ``[C * K, F]`` transposed once here. The result is ``[N, pixels, F]`` memory returned as a
    ``[N, F, *O]`` view (channels last): numpy's ops read any strides, and laying it out again
    would cost a conv this small as much as its product."""
    n, c_in = in_shape[:2]
    c_out, kernel = weight.shape[0], list(weight.shape[2:])
    nd = len(kernel)
    pixels = int(np.prod(out_sizes, dtype=np.int64))
    w_t = np.ascontiguousarray(weight.reshape(c_out, -1).T, dtype=dtype)  # [C*K, F]
    b = None if bias is None else as_float(bias).reshape(-1)
    padded_sizes = [before + size + after for size, (before, after) in zip(in_shape[2:], pads)]
    interior = (slice(None), slice(None)) + tuple(slice(b_, b_ + size) for size, (b_, _) in zip(in_shape[2:], pads))
    padding = any(before or after for before, after in pads)
    windows_shape = (n, *out_sizes, c_in, *kernel)
    back = (0, nd + 1, *range(1, nd + 1))  # [N, *O, F] -> [N, F, *O]

    def call(value):
        if padding:
            source = np.zeros((n, c_in, *padded_sizes), dtype)
            source[interior] = value
        else:
            source = value
        st = source.strides
        view = as_strided(source, windows_shape,
                          (st[0], *(st[2 + d] * strides[d] for d in range(nd)), st[1],
                           *(st[2 + d] * dilations[d] for d in range(nd))), writeable=False)
        cols = np.empty((n * pixels, w_t.shape[0]), dtype)
        np.copyto(cols.reshape(windows_shape), view)
        product = np.matmul(cols, w_t)
        product = _plus_last_axis(product, b)
        return product.reshape(n, *out_sizes, c_out).transpose(back)

    return call


def _im2col_windows(inp, weight, strides, dilations, pads, groups, out):
    """``_im2col`` for small maps with many taps: every window gathered by one copy of the
    (padded) input's window view per band of output rows, whatever the number of taps."""
    n, c_in = inp.shape[:2]
    c_out, kernel = out.shape[1], list(weight.shape[2:])
    nd, out_sizes = len(kernel), list(out.shape[2:])
    taps, rest = int(np.prod(kernel, dtype=np.int64)), int(np.prod(out_sizes[1:], dtype=np.int64))
    w = weight.reshape(groups, c_out // groups, (c_in // groups) * taps)  # [G, Fg, Cg*K]
    out_rows = out.reshape(n, groups, c_out // groups, out_sizes[0], rest)
    # window axes [N, C, rows, *O_rest, *K] -> [N, C, *K, rows, *O_rest]: rows of the matrix
    # are (channel, tap), columns the output pixels, as weight's [Cg, *K] flattens
    order = (0, 1, *range(2 + nd, 2 + 2 * nd), *range(2, 2 + nd))
    for start, stop in _bands(out_sizes, n * c_in * taps * rest):
        win = _band_windows(inp, pads, out_sizes, kernel, strides, dilations, start, stop)
        cols = np.empty((n, c_in, *kernel, stop - start, *out_sizes[1:]), out.dtype)
        np.copyto(cols, win.transpose(order))
        cols = cols.reshape(n, groups, w.shape[2], (stop - start) * rest)
        product = np.matmul(w, cols)  # [N, G, Fg, rows * rest]
        out_rows[:, :, :, start:stop] = product.reshape(n, groups, c_out // groups, stop - start, rest)


SMALL_MAP_PIXELS = 256  # output pixels per sample below which a batch's small-map conv is one matrix


def _depthwise_call(in_shape, weight, strides, dilations, pads, out_sizes, dtype):
    """``(value, out) -> None``: a depthwise conv (one input channel per output channel) of an
    input of ``in_shape`` into ``out``, its geometry worked out here once per op. Each band of
    output rows gathers its kernel taps from the padded input by one strided copy into
    ``[N, C, K, pixels]`` and sums them with each channel's taps by one batched ``matmul``: one
    numpy call per tap over whole channels ran 2-3x slower on MobileNet's maps. With unit strides
    the padded input is flattened per channel and every tap reads one contiguous run of it (the
    output laid out on the padded row pitch, its extra columns cropped at the end), so the copy
    moves long runs rather than one output row at a time."""
    n, channels = in_shape[:2]
    kernel, nd = list(weight.shape[2:]), len(in_shape) - 2
    taps = int(np.prod(kernel, dtype=np.int64))
    padded_sizes = [before + size + after for size, (before, after) in zip(in_shape[2:], pads)]
    interior = (slice(None), slice(None)) + tuple(slice(b, b + size) for size, (b, _) in zip(in_shape[2:], pads))
    w = np.ascontiguousarray(weight.reshape(channels, 1, taps), dtype=dtype)  # [C, 1, K]
    item = np.dtype(dtype).itemsize
    flat = all(s == 1 for s in strides)
    pitches = [int(np.prod(padded_sizes[d + 1:], dtype=np.int64)) for d in range(nd)]
    # output elements of one output row per channel as computed: on the pitch when flat
    row = pitches[0] if flat else int(np.prod(out_sizes[1:], dtype=np.int64))
    rows = max(1, min(out_sizes[0], TILE_ELEMENTS // max(n * channels * taps * row, 1)))
    total = int(np.prod(padded_sizes, dtype=np.int64))
    reach = sum((k - 1) * d * p for k, d, p in zip(kernel, dilations, pitches))
    # slack past the end when flat: the last row's cropped columns read past the padded input
    length = max(total, reach + out_sizes[0] * row) if flat else total
    tap_strides = tuple(p * d * item for p, d in zip(pitches, dilations))
    out_strides = (item,) if flat else tuple(p * s * item for p, s in zip(pitches, strides))
    band_shape = (n, channels, *kernel, *((rows * row,) if flat else (rows, *out_sizes[1:])))
    crop = (Ellipsis,) + tuple(slice(0, size) for size in out_sizes[1:])

    def compute(value, out):
        source = scratch("depthwise source", (n, channels, length), dtype)
        source.fill(0)  # the padding
        source[:, :, :total].reshape(n, channels, *padded_sizes)[interior] = value
        cols = scratch("depthwise taps", band_shape, dtype)
        acc = scratch("depthwise sums", (n, channels, out_sizes[0] * row), dtype) if flat else out.reshape(n, channels, -1)
        for start in range(0, out_sizes[0], rows):
            stop = min(start + rows, out_sizes[0])
            shape = (*band_shape[:2 + nd], *(((stop - start) * row,) if flat else (stop - start, *out_sizes[1:])))
            offset = start * (pitches[0] if flat else pitches[0] * strides[0])
            view = as_strided(source[:, :, offset:], shape, (*source.strides[:2], *tap_strides, *out_strides),
                              writeable=False)
            gathered = cols.reshape(-1)[:int(math.prod(shape))].reshape(shape)  # a shorter last band: a prefix
            np.copyto(gathered, view)
            np.matmul(w, gathered.reshape(n, channels, taps, -1),
                      out=acc[:, :, start * row:stop * row].reshape(n, channels, 1, -1))
        if flat:
            out[...] = acc.reshape(n, channels, out_sizes[0], *padded_sizes[1:])[crop]

    return compute


@evaluates("conv_transpose")
def conv_transpose(op, x):
    inp, weight = as_float(x["x"]), as_float(x["weight"])
    nd = inp.ndim - 2
    strides, dilations, groups, pad_type, pad = _spatial_params(op, x, nd)
    n, c_in = inp.shape[:2]
    kernel = list(weight.shape[2:])
    c_out = weight.shape[1] * groups
    in_sizes = list(inp.shape[2:])

    # Every input pixel times every kernel tap, then scattered into the full output:
    # position i*stride + k*dilation. Loops run over kernel taps only.
    xg = inp.reshape((n, groups, c_in // groups) + tuple(in_sizes))
    wg = weight.reshape((groups, c_in // groups) + weight.shape[1:])
    d_axes, k_axes = string.ascii_lowercase[:nd], string.ascii_lowercase[nd : 2 * nd]
    taps = np.einsum(f"NGC{d_axes},GCF{k_axes}->NGF{d_axes}{k_axes}", xg, wg, optimize=True)
    taps = taps.reshape((n, c_out) + taps.shape[3:])
    full_sizes = [(d - 1) * s + e for d, s, e in zip(in_sizes, strides, effective_kernel(kernel, dilations))]
    full = np.zeros([n, c_out] + full_sizes, dtype=taps.dtype)
    for tap in itertools.product(*(range(k) for k in kernel)):
        target = tuple(
            slice(k * d, k * d + (size - 1) * s + 1, s)
            for k, d, s, size in zip(tap, dilations, strides, in_sizes)
        )
        full[(slice(None), slice(None)) + target] += taps[(Ellipsis,) + tap]

    starts, out_sizes = _transpose_crop(op, x, pad_type, pad, in_sizes, strides, full_sizes)
    out = np.zeros([n, c_out] + out_sizes, dtype=full.dtype)
    src, dst = [slice(None)] * 2, [slice(None)] * 2
    for start, size, full_size in zip(starts, out_sizes, full_sizes):
        stop = min(start + size, full_size)
        src.append(slice(start, stop))
        dst.append(slice(0, max(stop - start, 0)))
    out[tuple(dst)] = full[tuple(src)]
    return _add_bias(out, x.get("bias"))


def _transpose_crop(op, x, pad_type, pad, in_sizes, strides, full_sizes):
    """Where the output window starts in the full (uncropped) result, and its size."""
    nd = len(in_sizes)
    output_shape = x.get("output_shape")
    pad_type = pad_type.lower()
    if pad_type == "custom":
        pads = ints(pad)
        starts = [pads[2 * i] for i in range(nd)]
        sizes = [full_sizes[i] - pads[2 * i] - pads[2 * i + 1] for i in range(nd)]
    elif pad_type == "same":
        sizes = [d * s for d, s in zip(in_sizes, strides)]
        starts = None
    else:
        starts, sizes = [0] * nd, list(full_sizes)
    if output_shape is not None:
        sizes = ints(output_shape)[2:]
    if starts is None:
        starts = [max(f - o, 0) // 2 for f, o in zip(full_sizes, sizes)]
    return starts, sizes
