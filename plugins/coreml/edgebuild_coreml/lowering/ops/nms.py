"""NonMaxSuppression on Core ML's non_maximum_suppression, trimmed to ONNX's exact output.

ONNX runs NMS once per (batch, class) over all boxes and returns a variable-length
[num_selected, 3] list of (batch, class, box) rows. Core ML's op returns a fixed
``max_boxes`` slots per batch entry, unfilled slots padded (index -1 from iOS17). So the
lowering makes every (batch, class) pair a batch entry of its own (boxes tiled over the
classes, one score column each), runs one NMS with the static maximum
``min(max_output_boxes_per_class, number of boxes)``, masks the padding (and the boxes at or
under ``score_threshold``), and lists the surviving slots with ``non_zero`` — row-major, which
is ONNX's (batch, class, rank) order. The result has ONNX's dynamic shape; see
docs/op-notes.md.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.context import target_index
from edgebuild_coreml.lowering.ops._nn_util import as_float, float_np
from edgebuild_coreml.lowering.ops._util import is_static, shape_of
from edgebuild_coreml.lowering.registry import lowers


def _optional_scalar(ctx, node, index: int, what: str):
    if not ctx.has_input(node, index):
        return None
    value = np.asarray(ctx.const(node, index, what=what)).reshape(-1)
    if value.size != 1:
        ctx.fail(node, f"{what} must hold one value, not {value.size}")
    return value[0].item()


def _center_size(ctx, node, boxes):
    """[B, N, 4] boxes in Core ML's (x_center, y_center, width, height) form."""
    if ctx.attr(node, "center_point_box", 0):
        return boxes  # ONNX's centre form is Core ML's
    # ONNX corners are [y1, x1, y2, x2] of either diagonal, so widths are absolute values.
    y1, x1, y2, x2 = mb.split(x=boxes, num_splits=4, axis=-1, name=ctx.name(node, "corners"))
    centre_x = mb.mul(x=mb.add(x=x1, y=x2), y=np.float32(0.5))
    centre_y = mb.mul(x=mb.add(x=y1, y=y2), y=np.float32(0.5))
    width = mb.abs(x=mb.sub(x=x2, y=x1))
    height = mb.abs(x=mb.sub(x=y2, y=y1))
    return mb.concat(values=[centre_x, centre_y, width, height], axis=-1, name=ctx.name(node, "centre_size"))


def _trailing_shape(x, start: int):
    """[-1, *x.shape[start:]] as a reshape target: constant when those dims are static, else read at run
    time (the box count N is often decided by the data: a threshold, a TopK of it)."""
    dims = shape_of(x)[start:]
    if all(is_static(d) for d in dims):
        return np.array([-1, *dims], np.int32)
    tail = mb.slice_by_index(x=mb.shape(x=x), begin=np.array([start], np.int32), end=np.array([0], np.int32),
                             end_mask=[True])
    return mb.concat(values=[np.array([-1], np.int32), tail], axis=0)


@lowers("NonMaxSuppression", since=10)
def non_max_suppression(ctx, node):
    boxes, scores = as_float(ctx.input(node, 0)), as_float(ctx.input(node, 1))
    if len(shape_of(boxes)) != 3 or shape_of(boxes)[-1] != 4 or len(shape_of(scores)) != 3:
        ctx.fail(node, f"boxes {shape_of(boxes)} and scores {shape_of(scores)} must be [B, N, 4] and [B, C, N]")
    classes, count = shape_of(scores)[1], shape_of(boxes)[1]
    if not is_static(classes):
        ctx.fail(node, "the number of classes (scores dim 1) must be static",
                 hint="pin the input shapes in the recipe's source.inputs")
    per_class = int(_optional_scalar(ctx, node, 2, "max_output_boxes_per_class") or 0)
    if per_class <= 0:
        ctx.fail(node, "max_output_boxes_per_class is 0 or absent, so the node selects nothing; Core ML's "
                       "NMS needs at least one output slot", hint="give max_output_boxes_per_class a positive value")
    iou_threshold = float(_optional_scalar(ctx, node, 3, "iou_threshold") or 0.0)
    score_threshold = _optional_scalar(ctx, node, 4, "score_threshold")
    slots = min(per_class, int(count)) if is_static(count) else per_class
    if slots > np.iinfo(np.int32).max:
        ctx.decline(node, f"max_output_boxes_per_class is {per_class} and the box count (boxes dim 1) is decided at "
                    "run time with no static bound: Core ML's NMS preallocates max_boxes slots",
                    hint="give max_output_boxes_per_class the most boxes the model can select, or bound the box count "
                         "(a TopK with a constant k before the NMS)")
    dtype = float_np(boxes)
    classes = int(classes)

    centred = _center_size(ctx, node, boxes)  # [B, N, 4]
    ios17 = target_index(ctx.target) >= target_index("iOS17")
    if ios17:  # iOS17 puts the box axis last: boxes [B*C, 4, N], scores [B*C, 1, N]
        centred = mb.transpose(x=centred, perm=[0, 2, 1], name=ctx.name(node, "boxes_last"))
    if classes > 1:  # each (batch, class) pair becomes a batch entry of its own
        tiled = mb.tile(x=mb.expand_dims(x=centred, axes=[1]), reps=[1, classes, 1, 1])
        centred = mb.reshape(x=tiled, shape=_trailing_shape(centred, 1), name=ctx.name(node, "per_class_boxes"))
    flat_scores = mb.reshape(x=scores, shape=_trailing_shape(scores, 2),
                             name=ctx.name(node, "flat_scores"))  # [B*C, N]
    if ios17:
        _, _, indices = mb.non_maximum_suppression(
            boxes=centred, scores=mb.expand_dims(x=flat_scores, axes=[1]), iou_threshold=dtype(iou_threshold),
            max_boxes=np.int32(slots), name=ctx.name(node, "nms"))
        filled = mb.greater_equal(x=indices, y=np.int32(0))
    else:
        # The score threshold is applied below, strictly as ONNX does; Core ML's keeps ties.
        _, _, indices, counts = mb.non_maximum_suppression(
            boxes=centred, scores=mb.expand_dims(x=flat_scores, axes=[2]), iou_threshold=dtype(iou_threshold),
            score_threshold=dtype(np.finfo(dtype).min), max_boxes=np.int32(slots), name=ctx.name(node, "nms"))
        filled = mb.less(x=np.arange(slots, dtype=np.int32)[None, :], y=mb.expand_dims(x=counts, axes=[1]))
    if score_threshold is not None:
        picked = mb.gather_along_axis(x=flat_scores, indices=mb.maximum(x=indices, y=np.int32(0)), axis=1)
        above = mb.greater(x=picked, y=dtype(score_threshold))
        filled = mb.logical_and(x=filled, y=above, name=ctx.name(node, "selected"))
    # Filled slots form a prefix of each row, so non_zero lists them in ONNX's order.
    slots_taken = mb.non_zero(x=mb.cast(x=filled, dtype="int32"), name=ctx.name(node, "slots"))  # [M, 2]
    box = mb.gather_nd(x=indices, indices=slots_taken, name=ctx.name(node, "box"))
    row = mb.gather(x=slots_taken, indices=np.int32(0), axis=1, name=ctx.name(node, "row"))
    batch = mb.floor_div(x=row, y=np.int32(classes), name=ctx.name(node, "batch"))
    klass = mb.mod(x=row, y=np.int32(classes), name=ctx.name(node, "class"))
    return mb.stack(values=[batch, klass, box], axis=1, name=ctx.name(node))
