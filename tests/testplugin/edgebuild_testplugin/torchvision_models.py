"""torchvision, importable beside the CPU build of torch the project pins.

The index's torchvision wheel is built for CUDA, so its C extension does not load and importing
it fails ("operator torchvision::nms does not exist"). The model definitions are pure Python;
what they need of the extension is two ops: ``nms`` (detection post-processing) and
``roi_align`` (the two-stage detectors' box heads). Both are defined here with torch.library and
kernels in plain torch, under the extension's own schemas, before torchvision is imported, so
its fake (meta) registrations find them and ``torch.onnx.export`` maps them to ONNX's
NonMaxSuppression and RoiAlign as it does with the real extension.

The wheel lives outside site-packages, in ``<environment>/torchvision-models`` (the Makefile's
test environment puts it there with ``pip install --no-deps --target``): installed beside
transformers, every ``import transformers`` would import it without these ops and fail. This
module puts that folder on ``sys.path``; use ``from edgebuild_testplugin.torchvision_models import
torchvision`` before anything that imports torchvision in the same process.
"""

from __future__ import annotations

import torch

_LIBRARY = None
TARGET = "torchvision-models"  # the folder of the environment that holds the wheel


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
    import sys
    from pathlib import Path

    folder = Path(sys.prefix) / TARGET
    if folder.is_dir() and str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    _define_ops()
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
