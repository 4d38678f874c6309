"""Detection post-processing: non_maximum_suppression (iOS15 and iOS17 layouts).

Semantics follow coremltools' op definitions: boxes are CENTER_SIZE_WIDTH_FIRST
``(x, y, width, height)``; boxes are visited in descending score order (the earlier box first
on equal scores, as onnxruntime and torchvision do); a box is dropped when its IoU with an
already selected box is greater than ``iou_threshold``. With K classes a box's score is its
highest class score, and ``per_class_suppression`` lets only boxes of the same (argmax) class
suppress each other. Unfilled output slots hold index -1 and zero boxes and scores.

iOS15: boxes [n, B, 4], scores [n, B, K], a ``score_threshold`` (boxes scoring below it are
rejected first) and a fourth output, the number of boxes selected per batch.
iOS17: boxes [n, 4, B], scores [n, K, B], no score threshold, three outputs.
"""

from __future__ import annotations

import numpy as np

from .registry import evaluates


def _iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    """IoU of one (x, y, w, h) box with each row of ``others``."""
    half, halves = box[2:] / 2, others[:, 2:] / 2
    low = np.maximum(box[:2] - half, others[:, :2] - halves)
    high = np.minimum(box[:2] + half, others[:, :2] + halves)
    intersection = np.prod(np.clip(high - low, 0.0, None), axis=1)
    union = box[2] * box[3] + others[:, 2] * others[:, 3] - intersection
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(union > 0, intersection / union, 0.0)


def select_boxes(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float, max_boxes: int,
                 per_class: bool, score_threshold: float | None = None) -> list[int]:
    """Indices NMS keeps for one batch entry: boxes [B, 4], scores [B, K]."""
    boxes = boxes.astype(np.float64)
    best, classes = scores.max(axis=1), scores.argmax(axis=1)
    order = np.argsort(-best, kind="stable")
    if score_threshold is not None:
        order = order[best[order] >= score_threshold]
    kept: list[int] = []
    for index in order:
        if len(kept) == max_boxes:
            break
        rivals = [k for k in kept if not per_class or classes[k] == classes[index]]
        if rivals and (_iou(boxes[index], boxes[rivals]) > iou_threshold).any():
            continue
        kept.append(int(index))
    return kept


@evaluates("non_maximum_suppression")
def non_maximum_suppression(op, x):
    boxes, scores = np.asarray(x["boxes"]), np.asarray(x["scores"])
    iou_threshold, max_boxes = float(x["iou_threshold"]), int(x["max_boxes"])
    per_class = bool(x.get("per_class_suppression", False))
    ios15 = "score_threshold" in x
    if not ios15:  # iOS17 puts the box axis last
        boxes, scores = boxes.transpose(0, 2, 1), scores.transpose(0, 2, 1)
    batch, _, classes = scores.shape
    out_boxes = np.zeros((batch, max_boxes, 4), dtype=boxes.dtype)
    out_scores = np.zeros((batch, max_boxes, classes), dtype=scores.dtype)
    out_indices = np.full((batch, max_boxes), -1, dtype=np.int32)
    counts = np.zeros(batch, dtype=np.int32)
    for n in range(batch):
        kept = select_boxes(boxes[n], scores[n], iou_threshold, max_boxes, per_class,
                            float(x["score_threshold"]) if ios15 else None)
        counts[n] = len(kept)
        out_boxes[n, : len(kept)] = boxes[n, kept]
        out_scores[n, : len(kept)] = scores[n, kept]
        out_indices[n, : len(kept)] = kept
    if ios15:
        return out_boxes, out_scores, out_indices, counts
    return out_boxes.transpose(0, 2, 1), out_scores.transpose(0, 2, 1), out_indices
