"""Audio front ends (DFT, STFT, MelWeightMatrix) as matmuls with constant matrices.

Core ML has no FFT. A DFT of a known length is a matrix product: the signal's samples (real
and imaginary parts interleaved, as ONNX lays them out in the last dimension) times one
constant matrix of cosines and sines, built in float64 and stored at the signal's precision.
STFT gathers its frames with a constant index and folds a constant window into that matrix.
MelWeightMatrix depends only on its scalar inputs, so it folds to a constant.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._nn_util import float_np
from edgebuild_coreml.lowering.ops._util import is_static, shape_of
from edgebuild_coreml.lowering.registry import lowers


def _scalar(ctx, node, index: int, what: str, default=None):
    value = ctx.const(node, index, optional=default is not None, what=what)
    if value is None:
        return default
    return np.asarray(value).reshape(-1)[0].item()


def _static_dim(ctx, node, x, axis: int, what: str) -> int:
    size = shape_of(x)[axis]
    if not is_static(size):
        ctx.fail(node, f"the {what} dimension (axis {axis}) must have a static size to build the DFT matrix",
                 hint="pin the input shapes in the recipe's source.inputs")
    return int(size)


def _reshape_tail(x, keep: int, tail: list[int], name: str):
    """``x`` reshaped to its first ``keep`` dims followed by ``tail``."""
    lead = shape_of(x)[:keep]
    if all(is_static(d) for d in lead):
        return mb.reshape(x=x, shape=np.array([*lead, *tail], dtype=np.int32), name=name)
    lead_dims = mb.slice_by_size(x=mb.shape(x=x), begin=np.array([0], np.int32), size=np.array([keep], np.int32))
    shape = mb.concat(values=[lead_dims, np.array(tail, dtype=np.int32)], axis=0)
    return mb.reshape(x=x, shape=shape, name=name)


def dft_matrix(n_in: int, channels: int, length: int, *, inverse: bool, onesided: bool,
               window: np.ndarray | None = None) -> np.ndarray:
    """The [rows, cols] float64 matrix mapping interleaved input samples to interleaved outputs.

    Rows: the ``used`` input positions times ``channels`` (1: real, 2: real/imaginary).
    Forward: outputs are ``length`` bins (``length // 2 + 1`` when onesided), complex.
    Inverse: complex outputs scaled by 1/length; inverse + onesided is a real IRFFT of the
    one-sided spectrum (imaginary parts of the DC and Nyquist bins ignored, as numpy does).
    """
    irfft = inverse and onesided
    used = min(n_in, length // 2 + 1) if irfft else min(n_in, length)
    out = length if irfft else (length // 2 + 1 if onesided else length)
    n = np.arange(used)[:, None]
    k = np.arange(out)[None, :]
    theta = 2.0 * np.pi * np.mod(n * k, length) / length
    cos, sin = np.cos(theta), np.sin(theta)
    if irfft:  # rows are bins n, columns output samples k
        edge = (n == 0) | ((length % 2 == 0) & (n == length // 2))  # bins without a mirror image
        weight = np.where(edge, 1.0, 2.0)
        real_row, imag_row = weight * cos / length, np.where(edge, 0.0, -weight * sin / length)
        blocks = [[real_row], [imag_row]]
    elif inverse:
        blocks = [[cos / length, sin / length], [-sin / length, cos / length]]
    else:
        blocks = [[cos, -sin], [sin, cos]]
    out_channels = len(blocks[0])
    matrix = np.zeros((used, channels, out, out_channels))
    for c in range(channels):
        for d in range(out_channels):
            matrix[:, c, :, d] = blocks[c][d]
    if window is not None:
        matrix *= np.asarray(window, dtype=np.float64)[:used, None, None, None]
    return matrix.reshape(used * channels, out * out_channels)


def dft_along(ctx, node, x, axis: int, length: int, *, inverse: bool, onesided: bool,
              window: np.ndarray | None = None):
    """ONNX DFT of ``x`` ([..., channels]) along ``axis`` as one matmul; returns [..., bins, 1|2]."""
    rank = len(shape_of(x))
    n_in = _static_dim(ctx, node, x, axis, "signal")
    channels = _static_dim(ctx, node, x, rank - 1, "complex")
    if channels not in (1, 2):
        ctx.fail(node, f"the last dimension holds {channels} values; ONNX signals hold 1 (real) or 2 (complex)")
    matrix = dft_matrix(n_in, channels, length, inverse=inverse, onesided=onesided, window=window)
    used = matrix.shape[0] // channels
    out_channels = 1 if inverse and onesided else 2
    bins = matrix.shape[1] // out_channels

    # The transformed axis goes next to the channel axis, so (sample, channel) flattens into rows.
    perm = [i for i in range(rank - 1) if i != axis] + [axis, rank - 1]
    moved = x if perm == list(range(rank)) else mb.transpose(x=x, perm=perm, name=ctx.name(node, "to_last"))
    if used < n_in:
        begin = [0] * rank
        end = [0] * rank
        end[rank - 2] = used
        end_mask = [True] * rank
        end_mask[rank - 2] = False
        moved = mb.slice_by_index(x=moved, begin=begin, end=end, end_mask=end_mask, name=ctx.name(node, "used"))
    rows = _reshape_tail(moved, rank - 2, [used * channels], ctx.name(node, "rows"))
    product = mb.matmul(x=rows, y=matrix.astype(float_np(x)), name=ctx.name(node, "dft"))
    spectrum = _reshape_tail(product, rank - 2, [bins, out_channels], ctx.name(node, "bins"))
    back = list(np.argsort(perm))
    if back == list(range(rank)):
        return spectrum
    return mb.transpose(x=spectrum, perm=back, name=ctx.name(node))


@lowers("DFT", since=17)
def dft(ctx, node):
    x = ctx.input(node, 0)
    rank = len(shape_of(x))
    if ctx.opset >= 20:
        axis = int(_scalar(ctx, node, 2, "axis", default=-2))
    else:
        axis = int(ctx.attr(node, "axis", 1))
    if not -rank <= axis < rank or axis % rank == rank - 1:
        ctx.fail(node, f"axis {axis} is not a signal axis of a rank-{rank} input (the last axis holds the complex parts)")
    axis %= rank
    inverse = bool(ctx.attr(node, "inverse", 0))
    onesided = bool(ctx.attr(node, "onesided", 0))
    length = _scalar(ctx, node, 1, "dft_length", default=0) if ctx.has_input(node, 1) else 0
    if not length:
        n_in = _static_dim(ctx, node, x, axis, "signal")
        length = 2 * (n_in - 1) if inverse and onesided else n_in
    if length < 1:
        ctx.fail(node, f"dft_length {length} must be positive")
    return dft_along(ctx, node, x, axis, int(length), inverse=inverse, onesided=onesided)


@lowers("STFT", since=17)
def stft(ctx, node):
    signal = ctx.input(node, 0)
    if len(shape_of(signal)) != 3:
        ctx.fail(node, "the signal must be [batch, signal_length, 1 or 2]")
    signal_length = _static_dim(ctx, node, signal, 1, "signal length")
    step = int(_scalar(ctx, node, 1, "frame_step"))
    window = ctx.input(node, 2, optional=True)
    frame_length = _scalar(ctx, node, 3, "frame_length", default=0) if ctx.has_input(node, 3) else 0
    if not frame_length:
        frame_length = shape_of(window)[0] if window is not None else signal_length
    frame_length = int(frame_length)
    if window is not None and shape_of(window)[0] != frame_length:
        ctx.fail(node, f"the window holds {shape_of(window)[0]} values but frame_length is {frame_length}")
    if step < 1 or not 1 <= frame_length <= signal_length:
        ctx.fail(node, f"frame_step {step} and frame_length {frame_length} frame no window of a "
                       f"{signal_length}-sample signal")
    frames = 1 + (signal_length - frame_length) // step
    index = (np.arange(frames)[:, None] * step + np.arange(frame_length)[None, :]).astype(np.int32)
    framed = mb.gather(x=signal, indices=index, axis=1, name=ctx.name(node, "frames"))  # [B, F, L, C]
    constant_window = None
    if window is not None:
        window_value = ctx.const_value(node.inputs[2])
        if window_value is not None:
            constant_window = np.asarray(window_value, dtype=np.float64)
        else:
            column = mb.reshape(x=window, shape=np.array([frame_length, 1], np.int32), name=ctx.name(node, "window"))
            framed = mb.mul(x=framed, y=column, name=ctx.name(node, "windowed"))
    onesided = bool(ctx.attr(node, "onesided", 1))
    return dft_along(ctx, node, framed, 2, frame_length, inverse=False, onesided=onesided, window=constant_window)


def mel_weight_matrix(num_mel_bins: int, dft_length: int, sample_rate: int, lower_hz: float, upper_hz: float) -> np.ndarray:
    """[dft_length // 2 + 1, num_mel_bins] triangular filters, as the ONNX operator defines them.

    The mel scale is split into ``num_mel_bins + 2`` equal steps (ONNX divides by the number of
    edges, not the number of gaps); each edge maps to a spectrogram bin
    ``floor((dft_length + 1) * hz / sample_rate)``, and filter i rises from edge i to edge i+1
    and falls to edge i+2.
    """
    edges = np.arange(num_mel_bins + 2, dtype=np.float64)
    low_mel = 2595.0 * np.log10(1.0 + lower_hz / 700.0)
    high_mel = 2595.0 * np.log10(1.0 + upper_hz / 700.0)
    hz = 700.0 * (10.0 ** ((edges * (high_mel - low_mel) / edges.size + low_mel) / 2595.0) - 1.0)
    bins = np.floor((dft_length + 1) * hz / sample_rate).astype(np.int64)
    if bins.min() < 0 or bins.max() > dft_length // 2:
        raise ValueError(f"the band edges fall on spectrogram bins {bins.min()}..{bins.max()}, outside "
                         f"0..{dft_length // 2}")
    matrix = np.zeros((dft_length // 2 + 1, num_mel_bins))
    for i in range(num_mel_bins):
        left, centre, right = bins[i], bins[i + 1], bins[i + 2]
        if centre == left:
            matrix[centre, i] = 1.0
        else:
            j = np.arange(left, centre + 1)
            matrix[j, i] = (j - left) / (centre - left)
        if right > centre:
            j = np.arange(centre, right)
            matrix[j, i] = (right - j) / (right - centre)
    return matrix


@lowers("MelWeightMatrix", since=17)
def mel_weight_matrix_op(ctx, node):
    values = [_scalar(ctx, node, i, what) for i, what in enumerate(
        ("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz"))]
    num_mel_bins, dft_length, sample_rate = (int(v) for v in values[:3])
    lower_hz, upper_hz = float(values[3]), float(values[4])
    if num_mel_bins < 1 or dft_length < 1 or sample_rate < 1:
        ctx.fail(node, f"num_mel_bins {num_mel_bins}, dft_length {dft_length} and sample_rate {sample_rate} must be positive")
    if not 0.0 <= lower_hz < upper_hz:
        ctx.fail(node, f"the band [{lower_hz}, {upper_hz}] Hz is empty or negative")
    try:
        matrix = mel_weight_matrix(num_mel_bins, dft_length, sample_rate, lower_hz, upper_hz)
    except ValueError as exc:
        ctx.fail(node, str(exc), hint="keep upper_edge_hertz at or below sample_rate / 2")
    dtype = ir.DataType(ctx.attr(node, "output_datatype", 1)).numpy()
    return matrix.astype(dtype)
