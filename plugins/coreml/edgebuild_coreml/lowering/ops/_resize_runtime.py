"""Resize whose output sizes or scales are known only at run time (a detector pasting each
mask or heatmap into its own box inside a Loop).

No sampling grid can be computed at build time, so it is built in the graph, axis by axis:
the output positions come from ``range_1d`` over the run-time length, the coordinate
transformation is plain arithmetic on them, and the kernel's taps are gathered along the
axis and summed with run-time weights (1 tap for nearest, 2 for linear, 4 for cubic). The
arithmetic is float32, in the order onnxruntime's CPU kernel uses, so a coordinate on a
rounding boundary picks the same pixel; edge pixels are repeated as the spec's padding.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil.types.symbolic import is_symbolic

from edgebuild_coreml.lowering.ops._nn_util import float_np, is_float, shape_of

# Coordinate modes built at run time; tf_crop_and_resize (a run-time crop) is declined by name.
RUN_TIME_COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_F32 = np.float32


class _Axis:
    """One resized axis: input length, output length (int32 scalars), scale and the spec's
    length_resized (float32 scalars); each either a Python number or a MIL Var."""

    def __init__(self, in_len, out_len, scale, resized_length):
        self.in_len, self.out_len, self.scale, self.resized_length = in_len, out_len, scale, resized_length


def decline_unsupported(ctx, node, *, mode, coordinate_mode, nearest_mode, x):
    """Decline, by attribute, the forms the run-time grid does not build."""
    reason = None
    if bool(ctx.attr(node, "antialias", 0)):
        reason = "antialias=1 with output sizes known only at run time is not supported"
    elif coordinate_mode not in RUN_TIME_COORDINATE_MODES:
        reason = f"coordinate_transformation_mode {coordinate_mode!r} with run-time sizes or scales is not supported"
    elif mode == "nearest" and nearest_mode not in _NEAREST_MODES:
        reason = f"nearest_mode {nearest_mode!r} with run-time sizes or scales is not supported"
    elif mode != "nearest" and not is_float(x):
        reason = f"{mode} Resize of an integer tensor is not supported"
    elif _text(ctx.attr(node, "keep_aspect_ratio_policy"), "stretch") != "stretch":
        reason = "keep_aspect_ratio_policy other than 'stretch' with run-time sizes is not supported"
    if reason is not None:
        ctx.decline(node, reason, hint="make the Resize's sizes or scales constants (pin the input shapes)")


def _text(value, default: str) -> str:
    value = default if value is None else value
    return (value.decode() if isinstance(value, bytes) else str(value)).lower()


def _scalar(ctx, node, vector, index: int, tag: str):
    """Element ``index`` of a 1-D run-time (or constant) vector, as a scalar."""
    if isinstance(vector, np.ndarray):
        element = vector.reshape(-1)[index]
        return np.float32(element) if vector.dtype.kind == "f" else np.int32(element)
    known = getattr(vector, "sym_val", None)  # a concat of constants and inputs knows some elements
    if known is not None:
        element = np.asarray(known).reshape(-1)[index]
        if not is_symbolic(element) and isinstance(element, (int, float, np.generic)):
            return np.asarray(element, dtype=np.float32 if vector.dtype.__name__.startswith("fp") else np.int32)[()]
    if vector.dtype.__name__.startswith("fp"):
        # a [1] vector, not a scalar: a float scalar cannot carry the symbolic value MIL infers
        # for an element of a partly known concat; it broadcasts like one
        return mb.gather(x=vector, indices=np.array([index], dtype=np.int32), axis=0, name=ctx.name(node, tag))
    return mb.gather(x=vector, indices=np.int32(index), axis=0, name=ctx.name(node, tag))


def _length_of(ctx, node, x, axis: int):
    dim = shape_of(x)[axis]
    if not is_symbolic(dim):
        return np.int32(dim)
    return mb.gather(x=mb.shape(x=x, name=ctx.name(node, f"shape{axis}")), indices=np.int32(axis), axis=0,
                     name=ctx.name(node, f"len{axis}"))


def _f32(ctx, node, value, tag: str):
    if isinstance(value, (np.ndarray, np.generic, int, float)):
        return _F32(value)
    return mb.cast(x=value, dtype="fp32", name=ctx.name(node, tag))


def axes_geometry(ctx, node, x, axes, *, scales=None, sizes=None) -> dict[int, _Axis]:
    """Per resized axis, the lengths and scale the spec's formulas use, as onnxruntime sizes them:
    from sizes, scale = float(out) / float(in); from scales, out = floor(in * scale) and
    length_resized = in * scale, unfloored (align_corners divides by it)."""
    geometry = {}
    for i, a in enumerate(axes):
        in_len = _length_of(ctx, node, x, a)
        in_f = _f32(ctx, node, in_len, f"in{a}")
        if sizes is not None:
            out_len = _scalar(ctx, node, sizes, i, f"size{a}")
            out_f = _f32(ctx, node, out_len, f"out{a}_f")
            scale = mb.real_div(x=out_f, y=in_f, name=ctx.name(node, f"scale{a}"))
            geometry[a] = _Axis(in_len, out_len, scale, out_f)
        else:
            scale = _scalar(ctx, node, scales, i, f"scale{a}")
            stretched = mb.mul(x=in_f, y=scale, name=ctx.name(node, f"resized{a}"))
            floored = mb.cast(x=mb.floor(x=stretched, name=ctx.name(node, f"floor{a}")), dtype="int32",
                              name=ctx.name(node, f"out{a}_1"))
            out_len = floored if not shape_of(floored) else mb.squeeze(x=floored, axes=[0], name=ctx.name(node, f"out{a}"))
            geometry[a] = _Axis(in_len, out_len, scale, stretched)
    return geometry


def source_coordinates(ctx, node, axis: int, g: _Axis, coordinate_mode: str):
    """x_original for every output position of ``axis``, a float32 vector of run-time length."""
    name = lambda tag: ctx.name(node, f"{tag}{axis}")  # noqa: E731
    positions = mb.range_1d(start=np.int32(0), end=g.out_len, step=np.int32(1), name=name("positions"))
    x = mb.cast(x=positions, dtype="fp32", name=name("positions_f"))
    in_f = _f32(ctx, node, g.in_len, f"in_f{axis}_")
    if coordinate_mode in ("half_pixel", "pytorch_half_pixel", "half_pixel_symmetric"):
        unscaled = mb.real_div(x=mb.add(x=x, y=_F32(0.5), name=name("centre")), y=g.scale, name=name("unscaled"))
        centred = mb.sub(x=unscaled, y=_F32(0.5), name=name("half_pixel")) if coordinate_mode != "half_pixel_symmetric" else None
        if coordinate_mode == "pytorch_half_pixel":
            # a single output pixel samples the first input pixel
            longer = mb.greater(x=g.out_len, y=np.int32(1), name=name("longer"))
            return mb.select(cond=longer, a=centred, b=_F32(0), name=name("coords"))
        if coordinate_mode == "half_pixel_symmetric":
            out_f = _f32(ctx, node, g.out_len, f"out_f{axis}_")
            adjustment = mb.real_div(x=out_f, y=mb.mul(x=g.scale, y=in_f, name=name("scaled_in")), name=name("adjust"))
            offset = mb.mul(x=mb.real_div(x=in_f, y=_F32(2), name=name("half_in")),
                            y=mb.sub(x=_F32(1), y=adjustment, name=name("one_minus")), name=name("offset"))
            # onnxruntime's order: (offset + unscaled) - 0.5
            shifted = mb.add(x=offset, y=unscaled, name=name("shifted"))
            return mb.sub(x=shifted, y=_F32(0.5), name=name("coords"))
        return centred
    if coordinate_mode == "align_corners":
        single = mb.equal(x=g.resized_length, y=_F32(1), name=name("single"))
        span = mb.sub(x=g.resized_length, y=_F32(1), name=name("span"))
        safe_span = mb.select(cond=single, a=_F32(1), b=span, name=name("safe_span"))
        stretched = mb.real_div(x=mb.mul(x=x, y=mb.sub(x=in_f, y=_F32(1), name=name("in_span")), name=name("scaled")),
                                y=safe_span, name=name("aligned"))
        return mb.select(cond=single, a=_F32(0), b=stretched, name=name("coords"))
    if coordinate_mode == "asymmetric":
        return mb.real_div(x=x, y=g.scale, name=name("coords"))
    raise ValueError(f"unknown coordinate_transformation_mode {coordinate_mode!r}")


def _clamped(ctx, node, index, g: _Axis, tag: str):
    """Indices clamped to the input (edge padding), int32."""
    last = mb.sub(x=_f32(ctx, node, g.in_len, f"{tag}_len"), y=_F32(1), name=ctx.name(node, f"{tag}_last"))
    low = mb.maximum(x=index, y=_F32(0), name=ctx.name(node, f"{tag}_low"))
    high = mb.minimum(x=low, y=last, name=ctx.name(node, f"{tag}_high"))
    return mb.cast(x=high, dtype="int32", name=ctx.name(node, f"{tag}_index"))


def _nearest_index(ctx, node, coords, nearest_mode: str, axis: int):
    name = lambda tag: ctx.name(node, f"{tag}{axis}")  # noqa: E731
    if nearest_mode == "floor":
        return mb.floor(x=coords, name=name("nearest"))
    if nearest_mode == "ceil":
        return mb.ceil(x=coords, name=name("nearest"))
    floor = mb.floor(x=coords, name=name("floor"))
    frac = mb.sub(x=coords, y=floor, name=name("frac"))
    up = (mb.greater(x=frac, y=_F32(0.5), name=name("up")) if nearest_mode == "round_prefer_floor"
          else mb.greater_equal(x=frac, y=_F32(0.5), name=name("up")))
    return mb.select(cond=up, a=mb.add(x=floor, y=_F32(1), name=name("next")), b=floor, name=name("nearest"))


def _cubic_weight(ctx, node, distance, a: float, tag: str):
    """Keys' cubic convolution kernel of |distance| (the spec's cubic_coeff_a)."""
    name = lambda t: ctx.name(node, f"{tag}_{t}")  # noqa: E731
    d = mb.abs(x=distance, name=name("abs"))
    d2 = mb.mul(x=d, y=d, name=name("d2"))
    near = mb.add(x=mb.mul(x=mb.sub(x=mb.mul(x=d, y=_F32(a + 2), name=name("n1")), y=_F32(a + 3), name=name("n2")),
                           y=d2, name=name("n3")), y=_F32(1), name=name("near"))
    far_inner = mb.add(x=mb.mul(x=mb.sub(x=mb.mul(x=d, y=_F32(a), name=name("f1")), y=_F32(5 * a), name=name("f2")),
                                y=d, name=name("f3")), y=_F32(8 * a), name=name("f4"))
    far = mb.sub(x=mb.mul(x=far_inner, y=d, name=name("f5")), y=_F32(4 * a), name=name("far"))
    outer = mb.select(cond=mb.less(x=d, y=_F32(2), name=name("within")), a=far, b=_F32(0), name=name("outer"))
    return mb.select(cond=mb.less_equal(x=d, y=_F32(1), name=name("close")), a=near, b=outer, name=name("weight"))


def taps(ctx, node, coords, g: _Axis, axis: int, *, mode: str, nearest_mode: str, cubic_a: float,
         exclude_outside: bool) -> list[tuple]:
    """[(int32 indices, float32 weights or None)] whose weighted sum of gathers resamples ``axis``."""
    name = lambda tag: ctx.name(node, f"{tag}{axis}")  # noqa: E731
    if mode == "nearest":
        return [(_clamped(ctx, node, _nearest_index(ctx, node, coords, nearest_mode, axis), g, f"nearest{axis}"), None)]
    floor = mb.floor(x=coords, name=name("base"))
    frac = mb.sub(x=coords, y=floor, name=name("ratio"))
    if mode == "linear":
        right = mb.add(x=floor, y=_F32(1), name=name("right"))
        left_w = mb.sub(x=_F32(1), y=frac, name=name("left_w"))
        return [(_clamped(ctx, node, floor, g, f"left{axis}"), left_w), (_clamped(ctx, node, right, g, f"right{axis}"), frac)]
    positions, weights = [], []
    last = mb.sub(x=_f32(ctx, node, g.in_len, f"cubic_len{axis}"), y=_F32(1), name=name("cubic_last"))
    for k, offset in enumerate((-1, 0, 1, 2)):
        position = mb.add(x=floor, y=_F32(offset), name=name(f"tap{k}_"))
        weight = _cubic_weight(ctx, node, mb.sub(x=frac, y=_F32(offset), name=name(f"dist{k}_")), cubic_a,
                               f"cubic{axis}_{k}")
        if exclude_outside:
            inside = mb.logical_and(x=mb.greater_equal(x=position, y=_F32(0), name=name(f"ge{k}_")),
                                    y=mb.less_equal(x=position, y=last, name=name(f"le{k}_")), name=name(f"inside{k}_"))
            weight = mb.select(cond=inside, a=weight, b=_F32(0), name=name(f"kept{k}_"))
        positions.append(position)
        weights.append(weight)
    if exclude_outside:
        total = mb.add(x=mb.add(x=weights[0], y=weights[1], name=name("sum01")),
                       y=mb.add(x=weights[2], y=weights[3], name=name("sum23")), name=name("sum"))
        weights = [mb.real_div(x=w, y=total, name=name(f"norm{k}_")) for k, w in enumerate(weights)]
    return [(_clamped(ctx, node, p, g, f"cubic{axis}_{k}"), w) for k, (p, w) in enumerate(zip(positions, weights))]


def resample_axis(ctx, node, y, axis: int, rank: int, tap_list, *, last: bool):
    """Sum over taps of weight * gather(y, indices) along ``axis``."""
    final = ctx.name(node) if last else ctx.name(node, f"axis{axis}")
    if len(tap_list) == 1 and tap_list[0][1] is None:
        return mb.gather(x=y, indices=tap_list[0][0], axis=axis, name=final)
    others = [d for d in range(rank) if d != axis]
    total = None
    for k, (indices, weight) in enumerate(tap_list):
        gathered = mb.gather(x=y, indices=indices, axis=axis, name=ctx.name(node, f"axis{axis}_g{k}"))
        if float_np(y) != np.float32:
            weight = mb.cast(x=weight, dtype="fp16", name=ctx.name(node, f"axis{axis}_w{k}_half"))
        broadcast = mb.expand_dims(x=weight, axes=others, name=ctx.name(node, f"axis{axis}_w{k}"))
        term = mb.mul(x=gathered, y=broadcast, name=final if last and total is None and len(tap_list) == 1
                      else ctx.name(node, f"axis{axis}_t{k}"))
        is_last_term = k == len(tap_list) - 1
        total = term if total is None else mb.add(x=total, y=term, name=final if last and is_last_term
                                                  else ctx.name(node, f"axis{axis}_s{k}"))
    return total


def resample_run_time(ctx, node, x, *, mode, coordinate_mode, nearest_mode, scales=None, sizes=None, axes=None):
    """Resize ``x`` to lengths known only at run time; ``scales``/``sizes`` are Vars or arrays."""
    rank = len(shape_of(x))
    axes = list(range(rank)) if axes is None else [int(a) % rank for a in axes]
    decline_unsupported(ctx, node, mode=mode, coordinate_mode=coordinate_mode, nearest_mode=nearest_mode, x=x)
    geometry = axes_geometry(ctx, node, x, axes, scales=scales, sizes=sizes)
    cubic_a = float(ctx.attr(node, "cubic_coeff_a", -0.75))
    exclude_outside = bool(ctx.attr(node, "exclude_outside", 0))
    ordered = sorted(geometry)
    y = x
    for k, axis in enumerate(ordered):
        g = geometry[axis]
        coords = source_coordinates(ctx, node, axis, g, coordinate_mode)
        tap_list = taps(ctx, node, coords, g, axis, mode=mode, nearest_mode=nearest_mode, cubic_a=cubic_a,
                        exclude_outside=exclude_outside)
        y = resample_axis(ctx, node, y, axis, rank, tap_list, last=k == len(ordered) - 1)
    if not ordered:
        y = mb.identity(x=x, name=ctx.name(node))
    return y
