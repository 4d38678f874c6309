"""GridSample spelled out with gathers: any spatial rank, nearest/linear/cubic, every padding.

Each spatial axis is handled on its own: the grid's normalised coordinate is mapped to a
pixel coordinate (``align_corners``), rounded (nearest, half to even), moved back inside by
the padding mode (border clamps, reflection folds the continuous coordinate), and split into
taps (1, 2 or 4 input indices with weights). The output is the sum over every combination
of taps across axes of the product of their weights times the gathered pixel, as ONNX's
reference computes it. Registers nothing; ``grid_sample.py`` decides when to use it.
"""

from __future__ import annotations

import itertools

import numpy as np
from coremltools.converters.mil import Builder as mb

_CUBIC_A = -0.75


class _Ops:
    """MIL helpers naming every op after the node, in the input's float type."""

    def __init__(self, ctx, node, ftype):
        self.ctx, self.node, self.f = ctx, node, ftype

    def name(self, tag: str) -> str:
        return self.ctx.name(self.node, tag)

    def c(self, value):
        return np.asarray(value, dtype=self.f)

    def add(self, x, y, tag):
        return mb.add(x=x, y=y, name=self.name(tag))

    def sub(self, x, y, tag):
        return mb.sub(x=x, y=y, name=self.name(tag))

    def mul(self, x, y, tag):
        return mb.mul(x=x, y=y, name=self.name(tag))

    def floor(self, x, tag):
        return mb.floor(x=x, name=self.name(tag))

    def select(self, cond, a, b, tag):
        return mb.select(cond=cond, a=a, b=b, name=self.name(tag))

    def clip(self, x, low, high, tag):
        return mb.clip(x=x, alpha=self.c(low), beta=self.c(high), name=self.name(tag))


def _reflect(o: _Ops, x, low: float, high: float, tag: str):
    """Fold ``x`` into [low, high] by reflecting at the borders as often as needed."""
    span = high - low
    if span <= 0:
        return o.clip(x, low, high, tag)
    below = mb.less(x=x, y=o.c(low), name=o.name(tag + "_below"))
    above = mb.greater(x=x, y=o.c(high), name=o.name(tag + "_above"))
    distance = o.select(below, o.sub(o.c(low), x, tag + "_dlow"), o.sub(x, o.c(high), tag + "_dhigh"), tag + "_d")
    folds = o.floor(mb.real_div(x=distance, y=o.c(span), name=o.name(tag + "_ratio")), tag + "_folds")
    rest = o.sub(distance, o.mul(folds, o.c(span), tag + "_whole"), tag + "_rest")
    half = o.floor(o.mul(folds, o.c(0.5), tag + "_half"), tag + "_halff")
    odd = mb.greater(x=o.sub(folds, o.mul(half, o.c(2.0), tag + "_even"), tag + "_parity"), y=o.c(0.5),
                     name=o.name(tag + "_odd"))
    up_from_low = o.add(o.c(low), rest, tag + "_low_r")
    down_from_high = o.sub(o.c(high), rest, tag + "_high_r")
    from_low = o.select(odd, down_from_high, up_from_low, tag + "_from_low")
    from_high = o.select(odd, up_from_low, down_from_high, tag + "_from_high")
    return o.select(below, from_low, o.select(above, from_high, x, tag + "_in_high"), tag)


def _cubic_weights(o: _Ops, t, tag: str) -> list:
    """Keys' cubic convolution weights (a = -0.75) of the taps at -1, 0, 1, 2 from floor(x)."""
    a = _CUBIC_A

    def far(d, k):  # |d| in [1, 2]
        inner = o.add(o.mul(o.add(o.mul(d, o.c(a), f"{tag}{k}_a"), o.c(-5 * a), f"{tag}{k}_b"), d, f"{tag}{k}_c"),
                      o.c(8 * a), f"{tag}{k}_d")
        return o.add(o.mul(inner, d, f"{tag}{k}_e"), o.c(-4 * a), f"{tag}{k}")

    def near(d, k):  # |d| in [0, 1]
        inner = o.add(o.mul(d, o.c(a + 2), f"{tag}{k}_a"), o.c(-(a + 3)), f"{tag}{k}_b")
        return o.add(o.mul(o.mul(inner, d, f"{tag}{k}_c"), d, f"{tag}{k}_d"), o.c(1.0), f"{tag}{k}")

    one_minus = o.sub(o.c(1.0), t, tag + "_1mt")
    return [far(o.add(t, o.c(1.0), tag + "_tp1"), 0), near(t, 1), near(one_minus, 2),
            far(o.sub(o.c(2.0), t, tag + "_2mt"), 3)]


def _axis_taps(o: _Ops, coord, size: int, *, mode: str, padding: str, align_corners: bool, tag: str):
    """[(index (float, integral), weight or None)] for one spatial axis; index still unpadded."""
    if align_corners:
        x = o.mul(o.add(coord, o.c(1.0), tag + "_p1"), o.c((size - 1) / 2.0), tag + "_px")
        low, high = 0.0, size - 1.0
    else:
        x = o.mul(o.sub(o.mul(o.add(coord, o.c(1.0), tag + "_p1"), o.c(float(size)), tag + "_scaled"),
                        o.c(1.0), tag + "_shift"), o.c(0.5), tag + "_px")
        low, high = -0.5, size - 0.5
    if mode == "nearest":
        x = mb.round(x=x, name=o.name(tag + "_round"))
    if padding == "border":  # only coordinates beyond [low, high] move; cubic taps see the difference
        beyond = mb.logical_or(x=mb.less(x=x, y=o.c(low), name=o.name(tag + "_below")),
                               y=mb.greater(x=x, y=o.c(high), name=o.name(tag + "_above")), name=o.name(tag + "_out"))
        x = o.select(beyond, o.clip(x, 0.0, size - 1.0, tag + "_clamped"), x, tag + "_border")
    elif padding == "reflection":
        x = _reflect(o, x, low, high, tag + "_reflect")
    if mode == "nearest":
        # A reflected coordinate is integral; truncate as the reference does (non-negative here).
        return [(o.floor(o.clip(x, 0.0, float(size), tag + "_nonneg"), tag + "_idx") if padding == "reflection" else x,
                 None)]
    base = o.floor(x, tag + "_floor")
    t = o.sub(x, base, tag + "_frac")
    if mode == "linear":
        return [(base, o.sub(o.c(1.0), t, tag + "_w0")), (o.add(base, o.c(1.0), tag + "_i1"), t)]
    weights = _cubic_weights(o, t, tag + "_w")
    return [(o.add(base, o.c(float(k)), f"{tag}_i{k + 1}"), w) for k, w in zip(range(-1, 3), weights)]


def _fetch_index(o: _Ops, index, size: int, *, padding: str, align_corners: bool, tag: str):
    """(int32 index into the axis, validity mask or None) as the reference's pixel lookup."""
    if padding == "reflection":
        low, high = (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)
        index = _reflect(o, index, low, high, tag + "_reflect")
    valid = None
    if padding == "zeros":
        inside_low = mb.greater_equal(x=index, y=o.c(0.0), name=o.name(tag + "_ge0"))
        inside_high = mb.less_equal(x=index, y=o.c(size - 1.0), name=o.name(tag + "_lemax"))
        valid = mb.logical_and(x=inside_low, y=inside_high, name=o.name(tag + "_valid"))
    clamped = o.clip(index, 0.0, size - 1.0, tag + "_clamped")
    return mb.cast(x=o.floor(clamped, tag + "_whole"), dtype="int32", name=o.name(tag + "_int")), valid


def grid_sample_by_gather(ctx, node, x, grid, *, shape, grid_shape, mode: str, padding: str, align_corners: bool):
    """ONNX GridSample of ``x`` [N, C, *spatial] at ``grid`` [N, *out, D] (static shapes)."""
    o = _Ops(ctx, node, np.float16 if str(x.dtype).endswith("fp16") else np.float32)
    n, channels, spatial = shape[0], shape[1], list(shape[2:])
    out = list(grid_shape[1:-1])
    dims = len(spatial)
    points = int(np.prod(out, dtype=np.int64))
    flat_grid = mb.reshape(x=grid, shape=np.array([n, points, dims], np.int32), name=o.name("grid_flat"))
    per_axis = []
    for d in range(dims):  # grid's last axis lists coordinates innermost-first (x = W, y = H, ...)
        coord = mb.reshape(
            x=mb.slice_by_index(x=flat_grid, begin=np.array([0, 0, dims - 1 - d], np.int32),
                                end=np.array([n, points, dims - d], np.int32), name=o.name(f"axis{d}_coord_slice")),
            shape=np.array([n, points], np.int32), name=o.name(f"axis{d}_coord"))
        taps = _axis_taps(o, coord, spatial[d], mode=mode, padding=padding, align_corners=align_corners,
                          tag=f"axis{d}")
        fetched = []
        for k, (index, weight) in enumerate(taps):
            where, valid = _fetch_index(o, index, spatial[d], padding=padding, align_corners=align_corners,
                                        tag=f"axis{d}_tap{k}")
            if valid is not None:
                mask = mb.cast(x=valid, dtype="fp16" if o.f == np.float16 else "fp32", name=o.name(f"axis{d}_tap{k}_mask"))
                weight = mask if weight is None else o.mul(weight, mask, f"axis{d}_tap{k}_weight")
            fetched.append((where, weight))
        per_axis.append(fetched)

    strides = [int(np.prod(spatial[d + 1:], dtype=np.int64)) for d in range(dims)]
    indices, weights = [], []
    for combo in itertools.product(*per_axis):
        flat = None
        weight = None
        for d, (where, w) in enumerate(combo):
            term = where if strides[d] == 1 else mb.mul(x=where, y=np.int32(strides[d]), name=o.name("stride"))
            flat = term if flat is None else mb.add(x=flat, y=term, name=o.name("flat_index"))
            if w is not None:
                weight = w if weight is None else o.mul(weight, w, "weight")
        indices.append(flat)
        weights.append(weight)
    taps = len(indices)
    index = indices[0] if taps == 1 else mb.concat(values=indices, axis=1, name=o.name("indices"))
    index = mb.tile(x=mb.expand_dims(x=index, axes=[1], name=o.name("indices_n1")),
                    reps=np.array([1, channels, 1], np.int32), name=o.name("indices_nc"))
    pixels = mb.reshape(x=x, shape=np.array([n, channels, int(np.prod(spatial))], np.int32), name=o.name("pixels"))
    gathered = mb.gather_along_axis(x=pixels, indices=index, axis=2, name=o.name("gathered"))
    if all(w is None for w in weights):  # nearest without zero padding: one tap, no weights
        return mb.reshape(x=gathered, shape=np.array([n, channels, *out], np.int32), name=ctx.name(node))
    weight = weights[0] if taps == 1 else mb.concat(values=weights, axis=1, name=o.name("weights"))
    weighted = o.mul(gathered, mb.expand_dims(x=weight, axes=[1], name=o.name("weights_n1")), "weighted")
    split = mb.reshape(x=weighted, shape=np.array([n, channels, taps, points], np.int32), name=o.name("by_tap"))
    total = mb.reduce_sum(x=split, axes=[2], keep_dims=False, name=o.name("sum"))
    return mb.reshape(x=total, shape=np.array([n, channels, *out], np.int32), name=ctx.name(node))
