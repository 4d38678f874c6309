"""Detections compared as detection evaluation compares them: boxes matched by IoU, not element by element.

After a detector's NMS, a last-bit difference in one score or overlap changes which boxes survive
and in what order, so a cosine over the outputs measures the reordering rather than the model.
Here (``validate.detections``, :class:`edgebuild.recipe.validation.DetectionOutputs`), per image:

- each reference box, highest score first, is matched to the unmatched candidate box of the same
  label with the highest IoU, if that IoU is at least ``iou`` (ties: the first candidate);
- a box is *borderline* when a last-bit difference may legitimately add or drop it: its score is
  below the score cut plus ``score_margin`` (the cut: ``score_threshold``, raised to the lowest
  score of a side that holds ``max_detections`` boxes, where the cap cut), or it overlaps a
  higher-scored box of its label on its side by ``nms_iou - nms_margin`` or more (one rounding
  either way would have suppressed it). For matching, a box narrower than ``MIN_EXTENT`` of the
  largest reference coordinate along an axis is widened to it: an untrained detector's ReLU'd
  regression gives zero-width boxes, whose IoU would otherwise be 0 even with their own copy
  shifted by a last bit. A borderline box counts as matched when it is matched and
  is left out when it is not, on either side, so a flip of a borderline box changes no metric.
  We chose margins over the cut, not a fixed top-k, because a cut at a score (or overlap) is what
  the model itself applies: only the boxes near that cut can flip;
- ``box_recall``: matched reference boxes over the counted ones (borderline unmatched left out);
  ``box_precision`` likewise for the candidate's; ``box_match`` the lower of the two (1.0 when
  neither side counts a box); ``box_iou`` the mean IoU of the matched pairs and
  ``box_score_diff`` the largest score difference among them (left out without pairs);
  ``box_reference``, ``box_candidate``, ``box_borderline``: boxes counted on each side and the
  borderline ones left out.

Every output of the group then gets the ordinary metrics (:func:`edgebuild.verify.metrics.compare_output`)
over the matched pairs, in matched order: the boxes' cosine is that of the boxes that found each other.
That holds for any ``attached`` output with one row per detection, whatever the row is: an instance
mask ([N, 1, H, W], its cosine over the masks of matched pairs), keypoints ([N, K, 3]) and their
scores ([N, K]). An unmatched box takes its rows with it. An ``attached`` output with no row per
detection on either side (a per-image map or count: its shape does not start with the boxes'
``[..., N]``) is compared element by element, as an output outside the group; one with rows on one
side only is an error naming both shapes (the candidate computes a different number of rows).
Leading dimensions before ``N`` are batch dimensions, matched image by image.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from edgebuild.errors import BuildError

# Matching widens boxes narrower than this share of the largest reference coordinate (a third of a
# pixel at 320): a last-bit difference in a zero-width box then changes its IoU a little, not to 0.
# The NMS-borderline test keeps the boxes as they are, since the model's NMS does.
MIN_EXTENT = 1e-3


@dataclass(frozen=True)
class Side:
    """One image's detections from one side: boxes [N, 4], scores [N], labels [N]."""

    boxes: np.ndarray
    scores: np.ndarray
    labels: np.ndarray


@dataclass(frozen=True)
class Matching:
    pairs: list[tuple[int, int]]  # (reference index, candidate index)
    ious: list[float]
    reference_counted: int
    candidate_counted: int
    reference_matched: int  # counted reference boxes that are matched
    candidate_matched: int
    borderline: int  # unmatched borderline boxes left out, both sides


def iou_matrix(a: np.ndarray, b: np.ndarray, min_extent: float = 0.0) -> np.ndarray:
    """IoU of every box of ``a`` [N, 4] with every box of ``b`` [M, 4] (x1, y1, x2, y2), in float64.

    Boxes narrower than ``min_extent`` along an axis are widened to it about their centre, so that
    a degenerate box (zero width: an untrained head's ReLU'd regression) overlaps its own copy
    rather than nothing. Two empty boxes at the same place have IoU 1; NaN coordinates give 0.
    """
    a = _widened(np.asarray(a, dtype=np.float64).reshape(-1, 4), min_extent)
    b = _widened(np.asarray(b, dtype=np.float64).reshape(-1, 4), min_extent)
    area_a = np.clip(a[:, 2] - a[:, 0], 0, None) * np.clip(a[:, 3] - a[:, 1], 0, None)
    area_b = np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)
    width = np.clip(np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0]), 0, None)
    height = np.clip(np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1]), 0, None)
    inter = width * height
    union = area_a[:, None] + area_b[None, :] - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = np.where(union > 0, inter / np.where(union > 0, union, 1), np.all(a[:, None] == b[None, :], axis=2))
    return np.nan_to_num(iou, nan=0.0)


def _widened(boxes: np.ndarray, min_extent: float) -> np.ndarray:
    if min_extent <= 0 or not boxes.size:
        return boxes
    centre = (boxes[:, :2] + boxes[:, 2:]) / 2
    half = np.maximum(boxes[:, 2:] - boxes[:, :2], min_extent) / 2
    return np.concatenate([centre - half, centre + half], axis=1)


def min_extent_of(boxes: np.ndarray) -> float:
    """``MIN_EXTENT`` of the largest finite coordinate: a thousandth of the image, about."""
    finite = np.abs(np.asarray(boxes, dtype=np.float64))
    finite = finite[np.isfinite(finite)]
    return MIN_EXTENT * float(finite.max()) if finite.size else 0.0


def borderline(side: Side, cut: float, score_margin: float, nms_iou: float | None, nms_margin: float) -> np.ndarray:
    """Which boxes of ``side`` a last-bit difference may add or drop (see the module docstring)."""
    near_cut = side.scores < cut + score_margin
    if nms_iou is None or len(side.scores) < 2:
        return near_cut
    overlap = iou_matrix(side.boxes, side.boxes)
    higher = side.scores[None, :] > side.scores[:, None]  # [i, j]: j scores above i
    same_label = side.labels[:, None] == side.labels[None, :]
    near_suppression = np.any(higher & same_label & (overlap >= nms_iou - nms_margin), axis=1)
    return near_cut | near_suppression


def score_cut(reference: Side, candidate: Side, score_threshold: float | None, max_detections: int | None) -> float:
    """The score below which boxes are cut: the model's threshold, or the lowest score of a full side."""
    cut = -np.inf if score_threshold is None else float(score_threshold)
    for side in (reference, candidate):
        if max_detections is not None and len(side.scores) >= max_detections:
            cut = max(cut, float(np.min(side.scores)))
    return cut


def match(reference: Side, candidate: Side, *, iou: float, score_threshold: float | None = None,
          score_margin: float = 0.0, max_detections: int | None = None, nms_iou: float | None = None,
          nms_margin: float = 0.0) -> Matching:
    """Greedy matching of one image's detections (see the module docstring)."""
    overlaps = iou_matrix(reference.boxes, candidate.boxes, min_extent_of(reference.boxes))
    same_label = reference.labels[:, None] == candidate.labels[None, :]
    eligible = np.where(same_label & (overlaps >= iou), overlaps, -1.0)
    taken = np.zeros(len(candidate.scores), dtype=bool)
    pairs, ious = [], []
    for r in np.argsort(-reference.scores, kind="stable"):
        row = np.where(taken, -1.0, eligible[r])
        if row.size and row.max() >= 0:
            c = int(np.argmax(row))
            taken[c] = True
            pairs.append((int(r), c))
            ious.append(float(overlaps[r, c]))
    cut = score_cut(reference, candidate, score_threshold, max_detections)
    ref_border = borderline(reference, cut, score_margin, nms_iou, nms_margin)
    cand_border = borderline(candidate, cut, score_margin, nms_iou, nms_margin)
    ref_matched = np.zeros(len(reference.scores), dtype=bool)
    ref_matched[[r for r, _ in pairs]] = True
    ref_counted = ~ref_border | ref_matched
    cand_counted = ~cand_border | taken
    return Matching(pairs, ious, int(ref_counted.sum()), int(cand_counted.sum()), int(ref_matched.sum()),
                    int(taken.sum()), int((~ref_counted).sum() + (~cand_counted).sum()))


def compare_detections(group, reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray],
                       compare_output: Callable[..., dict], *, where: str = "validate.detections",
                       rel_floor: float) -> dict[str, dict[str, float]]:
    """Metrics for every output of one detector ``group`` (a ``DetectionOutputs``) on one sample."""
    whole = image_level(group, reference, candidate, where)
    ref_images = _images(group, reference, "reference", where, whole)
    cand_images = _images(group, candidate, "candidate", where, whole)
    if len(ref_images) != len(cand_images):
        raise BuildError(f"{where}: output '{group.boxes}' holds {len(ref_images)} images in the reference and "
                         f"{len(cand_images)} in the candidate (the dims before N must agree)")
    totals = dict(ref=0, cand=0, ref_matched=0, cand_matched=0, borderline=0)
    ious: list[float] = []
    score_diffs: list[float] = []
    gathered: dict[str, tuple[list, list]] = {name: ([], []) for name in group.outputs if name not in whole}
    for (ref_side, ref_rows), (cand_side, cand_rows) in zip(ref_images, cand_images):
        found = match(ref_side, cand_side, iou=group.iou, score_threshold=group.score_threshold,
                      score_margin=group.score_margin, max_detections=group.max_detections, nms_iou=group.nms_iou,
                      nms_margin=group.nms_margin)
        totals["ref"] += found.reference_counted
        totals["cand"] += found.candidate_counted
        totals["ref_matched"] += found.reference_matched
        totals["cand_matched"] += found.candidate_matched
        totals["borderline"] += found.borderline
        ious += found.ious
        r_index = [r for r, _ in found.pairs]
        c_index = [c for _, c in found.pairs]
        score_diffs += list(np.abs(ref_side.scores[r_index] - cand_side.scores[c_index]))
        for name in gathered:
            gathered[name][0].append(ref_rows[name][r_index])
            gathered[name][1].append(cand_rows[name][c_index])
    recall = totals["ref_matched"] / totals["ref"] if totals["ref"] else 1.0
    precision = totals["cand_matched"] / totals["cand"] if totals["cand"] else 1.0
    box_metrics = {"box_match": min(recall, precision), "box_recall": recall, "box_precision": precision,
                   "box_reference": float(totals["ref"]), "box_candidate": float(totals["cand"]),
                   "box_borderline": float(totals["borderline"])}
    if ious:
        box_metrics["box_iou"] = float(np.mean(ious))
        if group.scores is not None:
            box_metrics["box_score_diff"] = float(np.max(score_diffs))
    result = {}
    for name, (refs, cands) in gathered.items():
        ref, cand = np.concatenate(refs), np.concatenate(cands)
        if not ref.size:  # no pair: flat, so that no row of "classes" is read
            ref, cand = ref.reshape(0), cand.reshape(0)
        metrics = compare_output(name, ref, cand, rel_floor=rel_floor)
        for k in ("top1_agreement", "top5_agreement"):  # a box's or mask's last dim is no class score
            metrics.pop(k, None)
        result[name] = metrics
    for name in whole:  # one value per image, not per detection: element by element, as outside the group
        ref = np.asarray(reference[name])
        result[name] = compare_output(name, ref, np.asarray(candidate[name]).reshape(ref.shape), rel_floor=rel_floor)
    result[group.boxes].update(box_metrics)
    return result


def per_detection(array: np.ndarray, lead: tuple[int, ...]) -> bool:
    """Whether ``array`` has one row per detection: its shape starts with the boxes' batch dims and N."""
    return tuple(np.shape(array)[:len(lead)]) == tuple(lead)


def image_level(group, reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray],
                where: str) -> list[str]:
    """The ``attached`` outputs that hold no row per detection on either side (a per-image map, a
    count): compared element by element. One that has rows on one side only is an error."""
    ref_lead, cand_lead = _lead(group, reference, "reference", where), _lead(group, candidate, "candidate", where)
    whole = []
    for name in group.attached:
        ref, cand = _named(reference, name, "reference", where), _named(candidate, name, "candidate", where)
        ref_rows, cand_rows = per_detection(ref, ref_lead), per_detection(cand, cand_lead)
        if ref_rows and cand_rows:
            continue
        if not ref_rows and not cand_rows and (ref.shape == cand.shape or ref.size == cand.size):
            whole.append(name)
            continue
        raise BuildError(
            f"{where}: output '{name}' has shape {list(ref.shape)} in the reference and {list(cand.shape)} in the "
            f"candidate, beside boxes {list(ref_lead)} and {list(cand_lead)}: "
            + ("one row per detection in the reference only" if ref_rows else
               "one row per detection in the candidate only" if cand_rows else "the two shapes differ"),
            hint="the candidate computes a different number of rows than the source: inspect the step that makes "
                 "this output (edgebuild inspect); list in 'attached' only outputs with one row per detection")
    return whole


def _named(outputs: Mapping[str, np.ndarray], name: str, side: str, where: str) -> np.ndarray:
    if name not in outputs:
        raise BuildError(f"{where}: names output '{name}', which the {side} does not have "
                         f"(it has: {', '.join(outputs) or 'none'})",
                         hint="name the model's outputs (edgebuild inspect lists them)")
    return np.asarray(outputs[name])


def _lead(group, outputs: Mapping[str, np.ndarray], side: str, where: str) -> tuple[int, ...]:
    """The boxes' batch dims and N."""
    boxes = _named(outputs, group.boxes, side, where)
    if boxes.ndim < 2 or boxes.shape[-1] != 4:
        raise BuildError(f"{where}: output '{group.boxes}' has shape {list(boxes.shape)} in the {side}; "
                         "boxes are [..., N, 4] (x1, y1, x2, y2)")
    return tuple(boxes.shape[:-1])


def _images(group, outputs: Mapping[str, np.ndarray], side: str, where: str,
            whole: Sequence[str] = ()) -> list[tuple[Side, dict]]:
    """Per image (the dims before N flattened): its detections and its rows of every per-detection output."""
    for name in group.outputs:
        _named(outputs, name, side, where)
    lead = _lead(group, outputs, side, where)
    arrays = {group.boxes: np.asarray(outputs[group.boxes])}
    for name in group.outputs[1:]:
        if name in whole:
            continue
        array = np.asarray(outputs[name])
        if not per_detection(array, lead):
            raise BuildError(f"{where}: output '{name}' has shape {list(array.shape)} in the {side}, which does "
                             f"not start with the boxes' {list(lead)} (batch dims, then one row per detection)")
        arrays[name] = array
    count = int(np.prod(lead[:-1], dtype=np.int64))
    n = lead[-1]
    images = []
    for index in range(count):
        rows = {name: array.reshape(count, n, *array.shape[len(lead):])[index] for name, array in arrays.items()}
        scores = (rows[group.scores].astype(np.float64) if group.scores is not None
                  else np.linspace(1.0, 0.0, n, endpoint=False) if n else np.zeros(0))  # no scores: the given order
        labels = rows[group.labels] if group.labels is not None else np.zeros(n, dtype=np.int64)
        images.append((Side(rows[group.boxes], np.nan_to_num(scores, nan=-np.inf), labels), rows))
    return images


def detection_outputs(groups: Sequence) -> set[str]:
    """Every output some group compares."""
    return {name for group in groups for name in group.outputs}
