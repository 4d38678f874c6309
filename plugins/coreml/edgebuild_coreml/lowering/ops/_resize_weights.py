"""Per-axis sampling plans for ONNX Resize, computed in numpy at build time.

Resize is separable: along each axis, an output position samples the input at a source
coordinate given by ``coordinate_transformation_mode`` with a 1-D kernel (nearest, linear,
cubic, optionally antialiased). With static shapes that is a fixed [out, in] weight matrix
(or, for nearest, an index vector), which MIL applies exactly with matmul / gather.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

COORDINATE_MODES = (
    "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize",
)
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")


@dataclass
class AxisPlan:
    """How one axis is resampled: ``indices`` (nearest) or ``weights`` [out, in]; ``outside``
    flags output positions tf_crop_and_resize fills with the extrapolation value."""

    indices: np.ndarray | None = None
    weights: np.ndarray | None = None
    outside: np.ndarray | None = None


def source_coordinates(mode: str, out_size: int, in_size: int, scale: float, roi=(0.0, 1.0),
                       resized_length: float | None = None) -> np.ndarray:
    """x_original for every output index, following the ONNX Resize formulas.

    ``resized_length`` is the spec's length_resized, ``scale * in_size`` before flooring to
    the output size (align_corners and tf_crop_and_resize divide by it); it defaults to
    ``out_size``. Evaluated in float32 (float64 where onnxruntime widens, or where the length
    is fractional) so that coordinates landing exactly on a rounding boundary pick the same
    pixel as onnxruntime's CPU kernel.
    """
    f = np.float32
    x = np.arange(out_size, dtype=f)
    scale, length_in, length_out = f(scale), f(in_size), f(out_size)
    stretched = mode in ("align_corners", "tf_crop_and_resize")
    if stretched and resized_length is not None and resized_length != out_size:
        x, length_in, length_out = x.astype(np.float64), np.float64(in_size), np.float64(resized_length)
    if mode in ("half_pixel", "pytorch_half_pixel"):
        if mode == "pytorch_half_pixel" and out_size <= 1:
            return np.zeros(out_size, f)
        return (x + f(0.5)) / scale - f(0.5)
    if mode == "half_pixel_symmetric":
        adjustment = length_out / (scale * length_in)
        offset = length_in / f(2) * (f(1) - adjustment)
        return (offset + (x.astype(np.float64) + 0.5) / np.float64(scale) - 0.5).astype(f)
    if mode == "align_corners":
        return x * (length_in - f(1)) / (length_out - f(1)) if length_out != 1 else np.zeros(out_size, f)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_crop_and_resize":
        start, end = f(roi[0]), f(roi[1])
        if length_out != 1:
            return start * (length_in - f(1)) + x * (end - start) * (length_in - f(1)) / (length_out - f(1))
        return np.full(out_size, 0.5 * (float(start) + float(end)) * (in_size - 1), f)
    raise ValueError(f"unknown coordinate_transformation_mode {mode!r}")


def nearest_indices(coords: np.ndarray, in_size: int, nearest_mode: str, downscaling: bool) -> np.ndarray:
    """Index of the input pixel each output position copies (clamped to the input)."""
    floor = np.floor(coords)
    frac = coords - floor
    if nearest_mode == "round_prefer_floor":
        index = np.where(frac > 0.5, floor + 1, floor)
    elif nearest_mode == "round_prefer_ceil":
        index = np.where(frac >= 0.5, floor + 1, floor)
    elif nearest_mode == "floor":
        index = floor
    elif nearest_mode == "ceil":
        index = np.ceil(coords)
    elif nearest_mode == "simple":  # opset < 11 Resize / Upsample
        index = np.ceil(coords) if downscaling else np.trunc(coords)
    else:
        raise ValueError(f"unknown nearest_mode {nearest_mode!r}")
    return np.clip(index, 0, in_size - 1).astype(np.int32)


def _linear_kernel(distance: np.ndarray) -> np.ndarray:
    return np.clip(1.0 - np.abs(distance), 0.0, 1.0)


def _cubic_kernel(distance: np.ndarray, a: float) -> np.ndarray:
    d = np.abs(distance)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def interpolation_weights(coords, in_size: int, mode: str, scale: float, *, cubic_a: float = -0.75,
                          exclude_outside: bool = False, antialias: bool = False) -> np.ndarray:
    """[out, in] matrix: row i holds the kernel weights that produce output i."""
    support = 1 if mode == "linear" else 2  # kernel radius in input pixels
    stretch = min(scale, 1.0) if antialias else 1.0  # antialias widens the kernel when downscaling
    start = int(np.floor(-support / stretch) + 1)  # first tap, relative to the left neighbour
    taps = 2 - 2 * start
    # Left neighbour: the ratio lies in (0, 1], so an exact integer coordinate uses itself as the right tap.
    base = np.ceil(coords) - 1
    ratio = coords - base
    offsets = np.arange(taps) + start
    distance = (offsets[None, :] - ratio[:, None]) * stretch
    kernel = _linear_kernel(distance) if mode == "linear" else _cubic_kernel(distance, cubic_a)
    if stretch != 1.0:
        kernel = kernel / kernel.sum(axis=1, keepdims=True)
    positions = base[:, None] + offsets[None, :]
    inside = (positions >= 0) & (positions <= in_size - 1)
    if exclude_outside:
        kernel = np.where(inside, kernel, 0.0)
        kernel = kernel / kernel.sum(axis=1, keepdims=True)
    columns = np.clip(positions, 0, in_size - 1).astype(np.int64)  # edge padding
    weights = np.zeros((len(coords), in_size))
    rows = np.repeat(np.arange(len(coords)), taps)
    np.add.at(weights, (rows, columns.reshape(-1)), kernel.reshape(-1))
    return weights


def axis_plan(mode: str, coordinate_mode: str, out_size: int, in_size: int, scale: float, *, roi=(0.0, 1.0),
              nearest_mode: str = "round_prefer_floor", cubic_a: float = -0.75, exclude_outside: bool = False,
              antialias: bool = False, resized_length: float | None = None) -> AxisPlan:
    coords = source_coordinates(coordinate_mode, out_size, in_size, scale, roi, resized_length)
    outside = None
    if coordinate_mode == "tf_crop_and_resize":
        flags = (coords < 0) | (coords > in_size - 1)
        outside = flags if flags.any() else None
    if mode == "nearest":
        return AxisPlan(indices=nearest_indices(coords, in_size, nearest_mode, scale < 1), outside=outside)
    weights = interpolation_weights(coords, in_size, mode, scale, cubic_a=cubic_a,
                                    exclude_outside=exclude_outside, antialias=antialias)
    return AxisPlan(weights=weights, outside=outside)
