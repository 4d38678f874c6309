"""Spatial rearrangement evaluators: ``pad``, depth/space moves, pixel (un)shuffle.

(``space_to_batch``/``batch_to_space`` live with the shape ops.)
"""

from __future__ import annotations

import numpy as np

from ._params import ints, param, scalar
from .registry import evaluates

_NUMPY_PAD_MODE = {"constant": "constant", "reflect": "reflect", "replicate": "edge"}


@evaluates("pad")
def pad(op, x):
    v = np.asarray(x["x"])
    amounts = ints(x["pad"])
    n = len(amounts) // 2  # the last n dims are padded
    widths = [(0, 0)] * (v.ndim - n) + [(amounts[2 * i], amounts[2 * i + 1]) for i in range(n)]
    mode = str(scalar(param(op, x, "mode", "constant")))
    if mode == "constant":
        value = scalar(param(op, x, "constant_val", 0.0))
        return np.pad(v, widths, mode="constant", constant_values=value)
    return np.pad(v, widths, mode=_NUMPY_PAD_MODE[mode])


@evaluates("depth_to_space")
def depth_to_space(op, x):
    # TensorFlow's DCR order: channel index = (row_offset * bs + col_offset) * C_out + c.
    v = np.asarray(x["x"])
    bs = int(scalar(x["block_size"]))
    n, c, h, w = v.shape
    blocks = v.reshape(n, bs, bs, c // (bs * bs), h, w).transpose(0, 3, 4, 1, 5, 2)
    return blocks.reshape(n, c // (bs * bs), h * bs, w * bs)


@evaluates("space_to_depth")
def space_to_depth(op, x):
    v = np.asarray(x["x"])
    bs = int(scalar(x["block_size"]))
    n, c, h, w = v.shape
    blocks = v.reshape(n, c, h // bs, bs, w // bs, bs).transpose(0, 3, 5, 1, 2, 4)
    return blocks.reshape(n, c * bs * bs, h // bs, w // bs)


@evaluates("pixel_shuffle")
def pixel_shuffle(op, x):
    # PyTorch's CRD order: channel index = c * f * f + row_offset * f + col_offset.
    v = np.asarray(x["x"])
    f = int(scalar(x["upscale_factor"]))
    n, c, h, w = v.shape
    blocks = v.reshape(n, c // (f * f), f, f, h, w).transpose(0, 1, 4, 2, 5, 3)
    return blocks.reshape(n, c // (f * f), h * f, w * f)


@evaluates("pixel_unshuffle")
def pixel_unshuffle(op, x):
    v = np.asarray(x["x"])
    f = int(scalar(x["downscale_factor"]))
    n, c, h, w = v.shape
    blocks = v.reshape(n, c, h // f, f, w // f, f).transpose(0, 1, 3, 5, 2, 4)
    return blocks.reshape(n, c * f * f, h // f, w // f)
