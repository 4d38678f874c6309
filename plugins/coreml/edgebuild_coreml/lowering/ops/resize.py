"""Resize (opsets 10-19) and the deprecated Upsample.

Every mode, nearest_mode and coordinate_transformation_mode is reproduced exactly: the
sampling along each resized axis is computed in numpy at build time (``_resize_weights``)
and applied with MIL ``gather`` (nearest) or ``matmul`` (linear, cubic, antialias). The
common integer nearest upsampling becomes ``upsample_nearest_neighbor`` instead. This needs
static lengths on the resized axes and constant scales/sizes/roi. Sizes or scales computed at
run time take ``_resize_runtime`` instead, which builds the grid in the graph. An axis known only
at run time (a detector's roi count) may stay unresized.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil.types.symbolic import is_symbolic

from edgebuild_coreml.lowering.ops._nn_util import as_float, float_np, is_float, shape_of
from edgebuild_coreml.lowering.ops._resize_runtime import resample_run_time
from edgebuild_coreml.lowering.ops._resize_weights import COORDINATE_MODES, AxisPlan, axis_plan
from edgebuild_coreml.lowering.registry import lowers

_MODES = {"nearest": "nearest", "linear": "linear", "bilinear": "linear", "trilinear": "linear", "cubic": "cubic"}


def _text(value, default: str) -> str:
    value = default if value is None else value
    return (value.decode() if isinstance(value, bytes) else str(value)).lower()


def _output_geometry(ctx, node, shape, scales, sizes, axes, coordinate_mode, roi):
    """(output sizes, per-axis scales) for every axis of the input."""
    rank = len(shape)
    out, factors = list(shape), [1.0] * rank
    if sizes is not None:
        sizes = [int(s) for s in np.asarray(sizes).reshape(-1)]
        policy = _text(ctx.attr(node, "keep_aspect_ratio_policy"), "stretch")
        ratios = [sizes[i] / shape[a] for i, a in enumerate(axes)]
        if policy == "stretch":
            for i, a in enumerate(axes):
                out[a], factors[a] = sizes[i], ratios[i]
        elif policy in ("not_larger", "not_smaller"):
            common = min(ratios) if policy == "not_larger" else max(ratios)
            for a in axes:
                out[a], factors[a] = int(np.floor(common * shape[a] + 0.5)), common
        else:
            ctx.fail(node, f"unknown keep_aspect_ratio_policy {policy!r}")
        return out, factors
    if scales is None:
        ctx.fail(node, "neither scales nor sizes is given")
    scales = [float(s) for s in np.asarray(scales).reshape(-1)]
    if len(scales) != len(axes):
        ctx.fail(node, f"{len(scales)} scales for {len(axes)} axes")
    for i, a in enumerate(axes):
        # onnxruntime sizes the output as floor(in * scale) in every mode (roi is not applied).
        out[a] = int(np.floor(shape[a] * scales[i]))
        factors[a] = scales[i]
    return out, factors


def _roi_pairs(ctx, node, roi, axes) -> list[tuple[float, float]]:
    if roi is None or np.asarray(roi).size == 0:
        return [(0.0, 1.0)] * len(axes)
    roi = np.asarray(roi, dtype=np.float64).reshape(-1)
    n = len(axes)
    if roi.size != 2 * n:
        ctx.fail(node, f"roi has {roi.size} values; expected {2 * n} (starts then ends)")
    return [(roi[i], roi[n + i]) for i in range(n)]


def _apply_matrix(ctx, node, x, weights: np.ndarray, axis: int, rank: int, last: bool):
    """Contract ``x`` along ``axis`` with ``weights`` [out, in]."""
    name = ctx.name(node) if last else ctx.name(node, f"axis{axis}")
    w = weights.astype(float_np(x))
    if axis == rank - 1:
        return mb.matmul(x=x, y=np.ascontiguousarray(w.T), name=name)
    if axis == rank - 2:
        return mb.matmul(x=w, y=x, name=name)
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    moved = mb.transpose(x=x, perm=perm, name=ctx.name(node, f"axis{axis}_in"))
    product = mb.matmul(x=moved, y=np.ascontiguousarray(w.T), name=ctx.name(node, f"axis{axis}_mm"))
    return mb.transpose(x=product, perm=perm, name=name)


def _nearest_upsample_factors(plans: dict[int, AxisPlan], shape, rank) -> tuple[int, int] | None:
    """(sh, sw) when the plan is plain integer nearest upsampling of the last two axes."""
    if rank < 3 or any(a < rank - 2 for a in plans) or any(p.indices is None or p.outside is not None for p in plans.values()):
        return None
    factors = []
    for axis in (rank - 2, rank - 1):
        plan = plans.get(axis)
        if plan is None:
            factors.append(1)
            continue
        size = len(plan.indices)
        if size % shape[axis]:
            return None
        factor = size // shape[axis]
        if not np.array_equal(plan.indices, np.arange(size) // factor):
            return None
        factors.append(factor)
    return factors[0], factors[1]


def _is_identity(plan: AxisPlan, size: int) -> bool:
    if plan.outside is not None:
        return False
    if plan.indices is not None:
        return len(plan.indices) == size and np.array_equal(plan.indices, np.arange(size))
    return plan.weights.shape == (size, size) and np.allclose(plan.weights, np.eye(size), atol=0, rtol=0)


def _resized_length(factor: float, size: int, *, from_scales: bool) -> float:
    """The spec's length_resized = scale * length_original, unfloored: the float32 scale
    exactly as given, times the length in float64 (as onnx's reference evaluator does)."""
    if from_scales:
        return float(np.float32(factor)) * size
    return factor * size


def _leave_run_time_axes(ctx, node, shape, axes, scales, sizes, roi):
    """``(axes, scales, roi)`` without the axes whose length is known only at run time (a batch of
    rois): those may stay as they are, scale 1 and uncropped, while every resized axis needs its
    length at build time, where its sampling grid is computed."""
    run_time = [a for a in range(len(shape)) if is_symbolic(shape[a])]
    resized = [a for a in run_time if a in axes]
    if not resized:
        return axes, scales, roi
    hint = "pin the input shapes in the recipe"
    if sizes is not None or scales is None:
        ctx.fail(node, f"Resize to sizes needs static input shapes (dims {resized} of {shape} are known only at run "
                       "time): the sampling grid is computed at build time", hint)
    scales = np.asarray(scales, dtype=np.float64).reshape(-1)
    pairs = _roi_pairs(ctx, node, roi, axes)
    for a in resized:
        i = axes.index(a)
        if i >= scales.size or scales[i] != 1.0 or tuple(pairs[i]) != (0.0, 1.0):
            ctx.fail(node, f"Resize needs static input shapes on the axes it resizes: dim {a} of {shape} is known "
                           "only at run time: the sampling grid is computed at build time", hint)
    keep = [i for i, a in enumerate(axes) if a not in resized]
    kept_roi = None if roi is None else [pairs[i][0] for i in keep] + [pairs[i][1] for i in keep]
    return [axes[i] for i in keep], scales[keep], kept_roi


def resample(ctx, node, x, *, mode, coordinate_mode, nearest_mode, scales=None, sizes=None, roi=None, axes=None):
    """Shared by Resize and Upsample: build the per-axis plans and apply them."""
    shape = list(shape_of(x))
    rank = len(shape)
    axes = list(range(rank)) if axes is None else [int(a) % rank for a in axes]
    axes, scales, roi = _leave_run_time_axes(ctx, node, shape, axes, scales, sizes, roi)
    roi_pairs = _roi_pairs(ctx, node, roi, axes)
    out, factors = _output_geometry(ctx, node, shape, scales, sizes, axes, coordinate_mode, roi_pairs)
    antialias = bool(ctx.attr(node, "antialias", 0))
    plans: dict[int, AxisPlan] = {}
    for i, a in enumerate(axes):
        plan = axis_plan(
            mode, coordinate_mode, out[a], shape[a], factors[a], roi=roi_pairs[i], nearest_mode=nearest_mode,
            cubic_a=float(ctx.attr(node, "cubic_coeff_a", -0.75)), exclude_outside=bool(ctx.attr(node, "exclude_outside", 0)),
            antialias=antialias, resized_length=_resized_length(factors[a], shape[a], from_scales=sizes is None),
        )
        if not _is_identity(plan, shape[a]):
            plans[a] = plan
    if not plans:
        return mb.identity(x=x, name=ctx.name(node))
    if mode != "nearest" and not is_float(x):
        ctx.fail(node, f"{mode} Resize of an integer tensor is not supported", "cast the input to float first")

    fast = _nearest_upsample_factors(plans, shape, rank) if rank == 4 else None
    if fast is not None and not is_float(x):
        # upsample_nearest_neighbor takes float tensors only; an integer tensor (a quantised one, as
        # onnxruntime's QOperator format resizes) goes through fp32 and back, exact for a selection
        widened = mb.cast(x=x, dtype="fp32", name=ctx.name(node, "as_float"))
        upsampled = mb.upsample_nearest_neighbor(x=widened, scale_factor_height=fast[0], scale_factor_width=fast[1],
                                                 name=ctx.name(node, "upsampled"))
        return mb.cast(x=upsampled, dtype="int32", name=ctx.name(node))
    if fast is not None:
        return mb.upsample_nearest_neighbor(x=x, scale_factor_height=fast[0], scale_factor_width=fast[1],
                                            name=ctx.name(node))
    outside = [p.outside for p in plans.values() if p.outside is not None]
    ordered = sorted(plans)
    y = x
    for k, axis in enumerate(ordered):
        plan = plans[axis]
        last = k == len(ordered) - 1 and not outside
        if plan.indices is not None:
            y = mb.gather(x=y, indices=plan.indices, axis=axis,
                          name=ctx.name(node) if last else ctx.name(node, f"axis{axis}"))
        else:
            y = _apply_matrix(ctx, node, y, plan.weights, axis, rank, last)
    if outside:
        mask = np.zeros([1] * rank, dtype=bool)
        for axis, plan in plans.items():
            if plan.outside is not None:
                view = [1] * rank
                view[axis] = len(plan.outside)
                mask = mask | plan.outside.reshape(view)
        fill = np.asarray(float(ctx.attr(node, "extrapolation_value", 0.0)), dtype=float_np(y))
        y = mb.select(cond=mask, a=fill, b=y, name=ctx.name(node))
    return y


def _mode(ctx, node) -> str:
    mode = _text(ctx.attr(node, "mode"), "nearest")
    if mode not in _MODES:
        ctx.fail(node, f"unknown mode {mode!r}")
    return _MODES[mode]


@lowers("Resize", since=11)
def resize(ctx, node):
    x = as_float(ctx.input(node, 0))
    coordinate_mode = _text(ctx.attr(node, "coordinate_transformation_mode"), "half_pixel")
    if coordinate_mode not in COORDINATE_MODES:
        ctx.fail(node, f"unknown coordinate_transformation_mode {coordinate_mode!r}")
    if _run_time_operand(ctx, node, 2) or _run_time_operand(ctx, node, 3):
        return _resize_run_time(ctx, node, x, coordinate_mode)
    roi = ctx.const(node, 1, optional=True, what="roi") if coordinate_mode == "tf_crop_and_resize" else None
    scales = ctx.const(node, 2, optional=True, what="scales")
    sizes = ctx.const(node, 3, optional=True, what="sizes")
    if scales is not None and np.asarray(scales).size == 0:
        scales = None
    if sizes is not None and np.asarray(sizes).size == 0:
        sizes = None
    axes = ctx.attr(node, "axes")
    if coordinate_mode != "tf_crop_and_resize" and _resizes_a_run_time_axis(x, axes, scales, sizes):
        return resample_run_time(ctx, node, x, mode=_mode(ctx, node), coordinate_mode=coordinate_mode,
                                 nearest_mode=_text(ctx.attr(node, "nearest_mode"), "round_prefer_floor"),
                                 scales=scales, sizes=sizes, axes=axes)
    return resample(ctx, node, x, mode=_mode(ctx, node), coordinate_mode=coordinate_mode,
                    nearest_mode=_text(ctx.attr(node, "nearest_mode"), "round_prefer_floor"),
                    scales=scales, sizes=sizes, roi=roi, axes=axes)


def _resizes_a_run_time_axis(x, axes, scales, sizes) -> bool:
    """Whether an axis whose length is known only at run time is resized (not kept at scale 1),
    so that its grid, too, must be built in the graph."""
    shape = list(shape_of(x))
    axes = list(range(len(shape))) if axes is None else [int(a) % len(shape) for a in axes]
    run_time = [i for i, a in enumerate(axes) if is_symbolic(shape[a])]
    if not run_time or (sizes is None and scales is None):
        return False
    if sizes is not None:
        return True
    values = np.asarray(scales, dtype=np.float64).reshape(-1)
    return any(i >= values.size or values[i] != 1.0 for i in run_time)


def _run_time_operand(ctx, node, index: int) -> bool:
    """Whether scales (2) or sizes (3) is given and computed at run time."""
    return ctx.has_input(node, index) and ctx.const_value(node.inputs[index]) is None


def _resize_run_time(ctx, node, x, coordinate_mode):
    """Sizes or scales known only at run time: the sampling grid is built in the graph."""
    given = ctx.has_input(node, 3) and _run_time_operand(ctx, node, 3) or (
        ctx.has_input(node, 3) and np.asarray(ctx.const_value(node.inputs[3])).size > 0)
    sizes = ctx.input(node, 3) if given else None
    scales = ctx.input(node, 2) if sizes is None else None
    return resample_run_time(ctx, node, x, mode=_mode(ctx, node), coordinate_mode=coordinate_mode,
                             nearest_mode=_text(ctx.attr(node, "nearest_mode"), "round_prefer_floor"),
                             scales=scales, sizes=sizes, axes=ctx.attr(node, "axes"))


@lowers("Resize", since=10, until=10)
def resize_v10(ctx, node):
    """Opset 10 Resize is Upsample-9 by another name (asymmetric coordinates)."""
    return _upsample(ctx, node, ctx.const(node, 1, what="scales"))


@lowers("Upsample", since=7, until=8)
def upsample_scales_attribute(ctx, node):
    return _upsample(ctx, node, ctx.attr(node, "scales"))


@lowers("Upsample", since=9, until=9)
def upsample_scales_input(ctx, node):
    return _upsample(ctx, node, ctx.const(node, 1, what="scales"))


def _upsample(ctx, node, scales):
    x = as_float(ctx.input(node, 0))
    return resample(ctx, node, x, mode=_mode(ctx, node), coordinate_mode="asymmetric", nearest_mode="simple",
                    scales=np.asarray(scales, dtype=np.float64))
