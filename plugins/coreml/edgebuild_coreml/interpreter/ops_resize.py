"""Image resizing evaluators (MIL ``image_resizing.py``, iOS15-iOS17).

Separable resizes (upsample/resize, crop_resize) sample each spatial axis at positions from
``sample_positions``; ``resample`` and ``affine`` sample a per-pixel coordinate grid.
"""

from __future__ import annotations

import numpy as np

from edgebuild.plugin.reference import resampling

from ._params import as_float, ints, param, scalar
from .registry import evaluates


def sample_positions(mode: str, size_in: int, size_out: int) -> np.ndarray:
    """Grid points in ``[0, size_in-1]`` for a resize, per the ``resize_bilinear`` sampling modes."""
    i = np.arange(size_out, dtype=np.float64)
    mode = mode.upper()
    if mode in ("STRICT_ALIGN_CORNERS", "ALIGN_CORNERS"):
        if size_out == 1:
            grid = np.full(1, (size_in - 1) / 2 if mode == "ALIGN_CORNERS" else 0.0)
        else:
            grid = i * (size_in - 1) / (size_out - 1)
    elif mode == "DEFAULT":
        grid = i * size_in / size_out
    elif mode == "OFFSET_CORNERS":
        delta = max(1, size_in - 1) / size_out
        grid = 0.5 * delta + i * delta
    elif mode == "UNALIGN_CORNERS":
        spacing = size_in / size_out
        grid = i * spacing + 0.5 * spacing - 0.5
    else:
        raise ValueError(f"unknown sampling_mode {mode!r}")
    return np.clip(grid, 0, size_in - 1)


def box_positions(mode: str, start: float, end: float, size_out: int) -> np.ndarray:
    """Grid points over a crop box ``[start, end]`` (``crop_resize``); not clipped."""
    i = np.arange(size_out, dtype=np.float64)
    length = end - start
    mode = mode.upper()
    if mode in ("STRICT_ALIGN_CORNERS", "ALIGN_CORNERS"):
        if size_out == 1:
            return np.full(1, start + length / 2 if mode == "ALIGN_CORNERS" else start)
        return start + i * length / (size_out - 1)
    if mode == "DEFAULT":
        return start + i * length / size_out
    if mode == "OFFSET_CORNERS":
        delta = max(1.0, length) / size_out
        return start + 0.5 * delta + i * delta
    if mode == "UNALIGN_CORNERS":
        spacing = length / size_out
        return start + i * spacing + 0.5 * spacing - 0.5
    raise ValueError(f"unknown sampling_mode {mode!r}")


def nearest_along(arr: np.ndarray, axis: int, positions: np.ndarray) -> np.ndarray:
    index = np.clip(np.floor(positions + 0.5), 0, arr.shape[axis] - 1).astype(np.int64)
    return np.take(arr, index, axis=axis)


def _resize_linear(v, out_h, out_w, mode):
    v = resampling.linear_along(v, -2, sample_positions(mode, v.shape[-2], out_h))
    return resampling.linear_along(v, -1, sample_positions(mode, v.shape[-1], out_w))


def _take_index(v, axis, size_out):
    """Nearest neighbour at index floor(i * in / out): the scale is recomputed from the sizes."""
    size_in = v.shape[axis]
    index = np.minimum(np.arange(size_out) * size_in // size_out, size_in - 1)
    return np.take(v, index, axis=axis)


@evaluates("upsample_nearest_neighbor")
def upsample_nearest_neighbor(op, x):
    v = np.asarray(x["x"])
    scale_h = float(scalar(param(op, x, "scale_factor_height", 1)))
    scale_w = float(scalar(param(op, x, "scale_factor_width", 1)))
    out_h, out_w = int(np.floor(v.shape[-2] * scale_h)), int(np.floor(v.shape[-1] * scale_w))
    return _take_index(_take_index(v, -2, out_h), -1, out_w)


@evaluates("resize_nearest_neighbor")
def resize_nearest_neighbor(op, x):
    v = np.asarray(x["x"])
    out_h, out_w = int(scalar(x["target_size_height"])), int(scalar(x["target_size_width"]))
    return _take_index(_take_index(v, -2, out_h), -1, out_w)


@evaluates("upsample_bilinear")
def upsample_bilinear(op, x):
    v = as_float(x["x"])
    scale_h = float(scalar(param(op, x, "scale_factor_height", 1)))
    scale_w = float(scalar(param(op, x, "scale_factor_width", 1)))
    align_corners = bool(scalar(param(op, x, "align_corners", True)))
    half_pixel = x.get("half_pixel_centers")
    half_pixel = (not align_corners) if half_pixel is None else bool(scalar(half_pixel))
    out_h, out_w = int(np.floor(v.shape[-2] * scale_h)), int(np.floor(v.shape[-1] * scale_w))
    if align_corners:
        mode = "STRICT_ALIGN_CORNERS"
    else:
        mode = "UNALIGN_CORNERS" if half_pixel else "DEFAULT"
    return _resize_linear(v, out_h, out_w, mode)


@evaluates("resize_bilinear")
def resize_bilinear(op, x):
    v = as_float(x["x"])
    out_h = int(scalar(param(op, x, "target_size_height", 1)))
    out_w = int(scalar(param(op, x, "target_size_width", 1)))
    return _resize_linear(v, out_h, out_w, str(scalar(param(op, x, "sampling_mode", "DEFAULT"))))


@evaluates("resize")
def resize(op, x):
    v = np.asarray(x["x"])
    shape = ints(x["shape"])
    resized_dims = int(scalar(x["resized_dims"]))
    mode = str(scalar(param(op, x, "sampling_mode", "DEFAULT")))
    nearest = str(scalar(param(op, x, "interpolation_mode", "LINEAR"))).upper() == "NEAREST_NEIGHBOR"
    # Target sizes come from the trailing ``resized_dims`` entries of ``shape``; 0 keeps x's size.
    # ``shape`` may be shorter than x: its last entry lines up with x's last axis.
    out = v if nearest else as_float(v)
    for k in range(1, resized_dims + 1):
        axis = v.ndim - k
        target = shape[len(shape) - k] or v.shape[axis]
        positions = sample_positions(mode, v.shape[axis], target)
        out = nearest_along(out, axis, positions) if nearest else resampling.linear_along(out, axis, positions)
    return out


@evaluates("crop")
def crop(op, x):
    v = np.asarray(x["x"])
    top, bottom = ints(x["crop_height"])
    left, right = ints(x["crop_width"])
    return v[..., top : v.shape[-2] - bottom, left : v.shape[-1] - right]


def _box_corners(box, mode):
    """(h_start, w_start, h_end, w_end) from a box in any ``box_coordinate_mode``."""
    a, b, c, d = box
    if mode == "CORNERS_HEIGHT_FIRST":
        return a, b, c, d
    if mode == "CORNERS_WIDTH_FIRST":
        return b, a, d, c
    if mode == "CENTER_SIZE_HEIGHT_FIRST":
        return a - c / 2, b - d / 2, a + c / 2, b + d / 2
    if mode == "CENTER_SIZE_WIDTH_FIRST":
        return b - d / 2, a - c / 2, b + d / 2, a + c / 2
    raise ValueError(f"unknown box_coordinate_mode {mode!r}")


def _crop_one(image, box, op, x, out_h, out_w):
    """Resize one box of ``image [C, H, W]`` to ``[C, out_h, out_w]``."""
    height, width = image.shape[-2:]
    mode = str(scalar(param(op, x, "box_coordinate_mode", "CORNERS_HEIGHT_FIRST"))).upper()
    h0, w0, h1, w1 = _box_corners([float(b) for b in box], mode)
    scale = float(scalar(param(op, x, "spatial_scale", 1.0)))
    if bool(scalar(param(op, x, "normalized_coordinates", False))):
        h0, h1, w0, w1 = h0 * (height - 1), h1 * (height - 1), w0 * (width - 1), w1 * (width - 1)
    h0, h1, w0, w1 = h0 * scale, h1 * scale, w0 * scale, w1 * scale
    sampling = str(scalar(param(op, x, "sampling_mode", "DEFAULT")))
    pad_value = float(scalar(param(op, x, "pad_value", 0.0)))
    rows = resampling.linear_along(image, -2, box_positions(sampling, h0, h1, out_h), fill=pad_value)
    return resampling.linear_along(rows, -1, box_positions(sampling, w0, w1, out_w), fill=pad_value)


@evaluates("crop_resize")
def crop_resize(op, x):
    v = as_float(x["x"])
    out_h = int(scalar(param(op, x, "target_height", 1)))
    out_w = int(scalar(param(op, x, "target_width", 1)))
    if "boxes" in x and x.get("boxes") is not None:  # iOS17: boxes [N, 4] + box_indices [N]
        boxes = as_float(x["boxes"]).reshape(-1, 4)
        indices = x.get("box_indices")
        indices = np.arange(len(boxes)) if indices is None else ints(indices)
        crops = [_crop_one(v[int(i)], box, op, x, out_h, out_w) for box, i in zip(boxes, indices)]
        return np.stack(crops).astype(v.dtype)
    roi = as_float(x["roi"]).reshape(len(x["roi"]), -1)  # [N, 4] or [N, 5] (batch index first)
    if roi.shape[1] == 5:
        crops = [_crop_one(v[int(r[0])], r[1:], op, x, out_h, out_w)[None] for r in roi]
    else:
        crops = [np.stack([_crop_one(img, r, op, x, out_h, out_w) for img in v]) for r in roi]
    return np.stack(crops).astype(v.dtype)


def _pixel_coords(coords, size, mode, align_corners):
    if mode == "unnormalized":
        return coords
    if mode == "normalized_minus_one_to_one":
        return (coords + 1) / 2 * (size - 1) if align_corners else ((coords + 1) * size - 1) / 2
    if mode == "normalized_zero_to_one":
        return coords * (size - 1) if align_corners else coords * size - 0.5
    raise ValueError(f"unknown coordinates_mode {mode!r}")


def _map_index(index, size, padding_mode):
    """Map integer indices outside ``[0, size)`` per the padding mode; also an in-range mask."""
    inside = (index >= 0) & (index < size)
    if padding_mode == "border":
        return np.clip(index, 0, size - 1), inside | True
    if padding_mode == "reflection":
        period = max(2 * (size - 1), 1)
        folded = np.mod(index, period)
        return np.where(folded >= size, period - folded, folded), inside | True
    if padding_mode == "symmetric":
        period = 2 * size
        folded = np.mod(index, period)
        return np.where(folded >= size, period - 1 - folded, folded), inside | True
    return np.clip(index, 0, size - 1), inside  # constant: masked afterwards


def grid_sample(image, px, py, sampling_mode, padding_mode, padding_value):
    """Sample ``image [B, C, H, W]`` at pixel coordinates ``px, py [B, H2, W2]``."""
    b, c, height, width = image.shape
    batch = np.arange(b)[:, None, None]

    def gather(ix, iy):
        ix, in_x = _map_index(ix, width, padding_mode)
        iy, in_y = _map_index(iy, height, padding_mode)
        values = image[batch, :, iy, ix]  # [B, H2, W2, C]
        return np.where((in_x & in_y)[..., None], values, padding_value)

    if sampling_mode == "nearest":
        out = gather(np.floor(px + 0.5).astype(np.int64), np.floor(py + 0.5).astype(np.int64))
    else:
        x0, y0 = np.floor(px).astype(np.int64), np.floor(py).astype(np.int64)
        fx, fy = (px - x0)[..., None], (py - y0)[..., None]
        out = (
            gather(x0, y0) * (1 - fx) * (1 - fy)
            + gather(x0 + 1, y0) * fx * (1 - fy)
            + gather(x0, y0 + 1) * (1 - fx) * fy
            + gather(x0 + 1, y0 + 1) * fx * fy
        )
    return np.moveaxis(out, -1, 1).astype(image.dtype)


@evaluates("resample")
def resample(op, x):
    image = as_float(x["x"])
    coords = np.asarray(x["coordinates"], dtype=np.float64)
    mode = str(scalar(x["coordinates_mode"]))
    align = bool(scalar(x["align_corners"]))
    px = _pixel_coords(coords[..., 0], image.shape[-1], mode, align)
    py = _pixel_coords(coords[..., 1], image.shape[-2], mode, align)
    return grid_sample(
        image, px, py, str(scalar(x["sampling_mode"])), str(scalar(x["padding_mode"])),
        float(scalar(x["padding_value"])),
    )


@evaluates("affine")
def affine(op, x):
    image = as_float(x["x"])
    matrix = np.asarray(x["transform_matrix"], dtype=np.float64).reshape(-1, 6)
    matrix = np.broadcast_to(matrix, (image.shape[0], 6))
    out_h, out_w = int(scalar(x["output_height"])), int(scalar(x["output_width"]))
    mode = str(scalar(x["coordinates_mode"]))
    align = bool(scalar(x["align_corners"]))
    # Output pixel centres in the same normalized space, then mapped by the matrix.
    gx = _output_grid(out_w, mode, align)[None, None, :]
    gy = _output_grid(out_h, mode, align)[None, :, None]
    a = matrix[:, :, None, None]
    src_x = a[:, 0] * gx + a[:, 1] * gy + a[:, 2]
    src_y = a[:, 3] * gx + a[:, 4] * gy + a[:, 5]
    px = _pixel_coords(src_x, image.shape[-1], mode, align)
    py = _pixel_coords(src_y, image.shape[-2], mode, align)
    return grid_sample(
        image, px, py, str(scalar(x["sampling_mode"])), str(scalar(x["padding_mode"])),
        float(scalar(x["padding_value"])),
    )


def _output_grid(size, mode, align_corners):
    """Normalized coordinates of output pixel centres (inverse of ``_pixel_coords``)."""
    i = np.arange(size, dtype=np.float64)
    if mode == "unnormalized":
        return i
    if mode == "normalized_minus_one_to_one":
        return i / max(size - 1, 1) * 2 - 1 if align_corners else (2 * i + 1) / size - 1
    return i / max(size - 1, 1) if align_corners else (i + 0.5) / size
