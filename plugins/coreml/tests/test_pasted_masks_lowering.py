"""torchvision's mask pasting (Mask R-CNN's last step), exported by the TorchScript exporter as an
ONNX Loop whose carried value starts empty and grows by one mask per detection, through the
optimize stage, lowered to MIL and run by the interpreter: one mask per detection, as PyTorch
gives, at fp32 and fp16, for no detection, one and several."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx_cases import lower_and_run

from edgebuild.graph.optimize import optimize

torch = pytest.importorskip("torch")
pytest.importorskip("edgebuild_testplugin.torchvision_models")  # torchvision, its C ops in plain torch

SIZE = (24, 32)  # the image the masks are pasted into: height, width


def _paste(n: int):
    from edgebuild_testplugin.torchvision_models import torchvision  # noqa: F401
    from torchvision.models.detection.roi_heads import paste_masks_in_image

    class Paste(torch.nn.Module):
        def forward(self, masks, boxes):
            return paste_masks_in_image(masks, boxes, SIZE)

    generator = torch.Generator().manual_seed(n)
    masks = torch.rand(n, 1, 7, 7, generator=generator)
    corner = torch.rand(n, 2, generator=generator) * 16
    boxes = torch.cat([corner, corner + 3 + torch.rand(n, 2, generator=generator) * 6], dim=1)
    return Paste().eval(), masks, boxes


@pytest.mark.parametrize("precision, tolerance", [("float32", 1e-5), ("float16", 2e-2)], ids=["fp32", "fp16"])
@pytest.mark.parametrize("n", [0, 1, 3])
def test_pasted_masks_lower_with_one_mask_per_detection(tmp_path, n, precision, tolerance):
    module, masks, boxes = _paste(n)
    source = tmp_path / "paste.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (masks, boxes), str(source), input_names=["masks", "boxes"], opset_version=18,
                          dynamo=False)
        eager = module(masks, boxes).numpy()
    optimize(source, tmp_path / "optimized")
    model = onnx.load(str(tmp_path / "optimized" / "model.onnx"))
    assert any(node.op_type == "Loop" for node in model.graph.node)
    [found] = lower_and_run(model, {"masks": masks.numpy(), "boxes": boxes.numpy()}, precision=precision).values()
    assert eager.shape == (n, 1, *SIZE)
    assert found.shape == eager.shape
    np.testing.assert_allclose(found.astype(np.float32), eager, rtol=tolerance, atol=tolerance)
