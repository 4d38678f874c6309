"""torchvision, importable beside the CPU build of torch the project pins.

The index's torchvision wheel is built for CUDA, so its C extension does not load and importing
it fails ("operator torchvision::nms does not exist"). The model definitions are pure Python;
what they need of the extension is two ops: ``nms`` (detection post-processing) and
``roi_align`` (the two-stage detectors' box heads). Both are defined here with torch.library and
kernels in plain torch, under the extension's own schemas, before torchvision is imported, so
its fake (meta) registrations find them and ``torch.onnx.export`` maps them to ONNX's
NonMaxSuppression and RoiAlign as it does with the real extension.

Use ``from edgebuild_testplugin.torchvision_models import torchvision``; install the wheel with
``pip install --no-deps torchvision==0.28.0`` (the Makefile's test environment does).
"""

from __future__ import annotations

import torch

_LIBRARY = None


def _nms(dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy NMS: the indices kept, by decreasing score (the extension's CPU kernel's order)."""
    order = torch.argsort(scores, descending=True, stable=True)
    x1, y1, x2, y2 = dets.unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    suppressed = torch.zeros(dets.shape[0], dtype=torch.bool)
    keep = []
    for i in order.tolist():
        if suppressed[i]:
            continue
        keep.append(i)
        width = (torch.minimum(x2[i], x2) - torch.maximum(x1[i], x1)).clamp(min=0)
        height = (torch.minimum(y2[i], y2) - torch.maximum(y1[i], y1)).clamp(min=0)
        inter = width * height
        suppressed |= inter / (areas[i] + areas - inter) > iou_threshold
    return torch.tensor(keep, dtype=torch.int64)


def _roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    from torchvision.ops.roi_align import _roi_align  # torchvision's own pure-torch kernel

    return _roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)


def _define_ops() -> None:
    global _LIBRARY
    if _LIBRARY is not None or hasattr(torch.ops.torchvision, "nms"):
        return
    library = torch.library.Library("torchvision", "DEF")
    library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    library.define("roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
                   "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor")
    library.impl("nms", _nms, "CPU")
    library.impl("roi_align", _roi_align, "CPU")
    _LIBRARY = library  # a Library deregisters its ops when collected


def _has_ops() -> bool:  # a def, not a lambda: torchvision scripts the functions that call it
    return True


def _import_torchvision():
    _define_ops()
    import sys

    import torchvision
    import torchvision.extension

    # The extension "loaded" as far as these two ops go: nms asks before it calls its op, and
    # roi_align calls the op (which ONNX export maps to RoiAlign) instead of tracing its Python form.
    torchvision.extension._has_ops = _has_ops
    sys.modules["torchvision.ops.roi_align"]._has_ops = _has_ops  # the package's name is the function

    @torch.library.register_fake("torchvision::roi_align")
    def _roi_align_fake(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
        return input.new_empty((rois.shape[0], input.shape[1], pooled_height, pooled_width))

    return torchvision


torchvision = _import_torchvision()

__all__ = ["torchvision"]
