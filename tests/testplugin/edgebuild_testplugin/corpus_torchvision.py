"""torchvision's architectures in the corpus: classification, segmentation, detection, optical flow
and video models with random weights (``weights=None``), built from torchvision's own
constructors (smaller ones through their constructor arguments where the published one is heavy),
on small inputs.

torchvision is imported through :mod:`edgebuild_testplugin.torchvision_models` (its C ops defined
in plain torch first), and only when an entry is made.
"""

from __future__ import annotations

from .corpus import Detector, Entry, Made


def _tv():
    from .torchvision_models import torchvision

    return torchvision


def _image(size: int, batch: int = 1, channels: int = 3):
    import torch

    return torch.rand(batch, channels, size, size)


def _classifier(builder: str, size: int, **options):
    def make() -> Made:
        model = getattr(_tv().models, builder)(weights=None, **options)
        return Made(model.eval(), (_image(size),), ("image",))

    return make


def _resnet_small(**options):
    """A ResNet of one bottleneck per stage: resnext's grouped or wide_resnet's wide bottleneck, cheaper."""

    def make() -> Made:
        resnet = _tv().models.resnet
        model = resnet.ResNet(resnet.Bottleneck, [1, 1, 1, 1], num_classes=10, **options)
        return Made(model.eval(), (_image(64),), ("image",))

    return make


def _vit_small() -> Made:
    import torch

    vit = _tv().models.vision_transformer
    model = vit.VisionTransformer(image_size=64, patch_size=16, num_layers=2, num_heads=2, hidden_dim=64, mlp_dim=128,
                                  num_classes=10)
    torch.nn.init.normal_(model.heads.head.weight, std=0.02)  # torchvision starts it at zero: the logits would be 0
    return Made(model.eval(), (_image(64),), ("image",))


def _swin(version: int):
    def make() -> Made:
        swin = _tv().models.swin_transformer
        block = dict(block=swin.SwinTransformerBlockV2, downsample_layer=swin.PatchMergingV2) if version == 2 else {}
        model = swin.SwinTransformer(patch_size=[4, 4], embed_dim=32, depths=[2, 2], num_heads=[2, 4],
                                     window_size=[4, 4], num_classes=10, **block)
        return Made(model.eval(), (_image(64),), ("image",))

    return make


def _maxvit() -> Made:
    model = _tv().models.maxvit.MaxVit(input_size=(64, 64), stem_channels=16, partition_size=2,
                                       block_channels=[16, 32], block_layers=[1, 1], head_dim=8,
                                       stochastic_depth_prob=0.0, num_classes=10)
    return Made(model.eval(), (_image(64),), ("image",))


def _segmentation(builder: str, size: int, **options):
    def make() -> Made:
        model = getattr(_tv().models.segmentation, builder)(weights=None, weights_backbone=None, num_classes=5,
                                                             **options)
        return Made(_OutputOf(model, "out").eval(), (_image(size),), ("image",))

    return make


def _detection(builder: str, size: int = 320, **options):
    def make() -> Made:
        model = getattr(_tv().models.detection, builder)(weights=None, weights_backbone=None, num_classes=3,
                                                          **options)
        return Made(_FirstImage(model).eval(), (_image(size, batch=1),), ("image",), detector=_detector(model))

    return make


def _detector(model) -> Detector:
    """The outputs (FirstImage returns them by sorted key) and the cuts of a torchvision detector."""
    heads = getattr(model, "roi_heads", model)  # the R-CNNs cut in their box head
    keys = {"boxes", "labels", "scores"}
    if getattr(heads, "has_mask", lambda: False)():
        keys.add("masks")
    if getattr(heads, "has_keypoint", lambda: False)():
        keys |= {"keypoints", "keypoints_scores"}
    return Detector(tuple(sorted(keys)), float(heads.score_thresh), float(heads.nms_thresh),
                    int(heads.detections_per_img))


def _raft() -> Made:
    model = _tv().models.optical_flow.raft_small(weights=None)
    return Made(_LastFlow(model).eval(), (_image(128), _image(128)), ("image1", "image2"))  # its smallest


def _video(builder: str, frames: int, size: int, **options):
    def make() -> Made:
        import torch

        model = getattr(_tv().models.video, builder)(weights=None, num_classes=10, **options)
        return Made(model.eval(), (torch.rand(1, 3, frames, size, size),), ("clip",))

    return make


def _mvit_v2_small() -> Made:
    """mvit_v2_s's first two blocks (its pooling strides, relative positions and residual pooling), narrower."""
    import torch

    mvit = _tv().models.video.mvit
    MSBlockConfig = mvit.MSBlockConfig
    blocks = [MSBlockConfig(num_heads=1, input_channels=32, output_channels=32, kernel_q=[3, 3, 3],
                            kernel_kv=[3, 3, 3], stride_q=[1, 1, 1], stride_kv=[1, 4, 4]),
              MSBlockConfig(num_heads=2, input_channels=32, output_channels=64, kernel_q=[3, 3, 3],
                            kernel_kv=[3, 3, 3], stride_q=[1, 2, 2], stride_kv=[1, 2, 2])]
    model = mvit.MViT(spatial_size=(64, 64), temporal_size=4, block_setting=blocks, residual_pool=True,
                 residual_with_cls_embed=False, rel_pos_embed=True, proj_after_attn=True, num_classes=10)
    return Made(model.eval(), (torch.rand(1, 3, 4, 64, 64),), ("clip",))


def _wrappers():
    """Modules that give the exporter a tensor (or a tuple of tensors) where torchvision returns dicts or lists."""
    import torch

    class OutputOf(torch.nn.Module):
        def __init__(self, model, key):
            super().__init__()
            self.model, self.key = model, key

        def forward(self, image):
            return self.model(image)[self.key]

    class FirstImage(torch.nn.Module):
        """A detector on one image tensor, returning its boxes, scores and labels (as a user wraps it for export)."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, image):
            [found] = self.model(list(image))
            return tuple(found[key] for key in sorted(found))

    class LastFlow(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, image1, image2):
            return self.model(image1, image2, num_flow_updates=2)[-1]  # two refinement steps of the default 12

    return OutputOf, FirstImage, LastFlow


def _OutputOf(model, key):
    return _wrappers()[0](model, key)


def _FirstImage(model):
    return _wrappers()[1](model)


def _LastFlow(model):
    return _wrappers()[2](model)


ENTRIES = [
    # classification
    Entry("classification", "resnet18", _classifier("resnet18", 64)),
    Entry("classification", "resnext_small", _resnet_small(groups=32, width_per_group=4)),
    Entry("classification", "wide_resnet_small", _resnet_small(width_per_group=128)),
    Entry("classification", "mobilenet_v2", _classifier("mobilenet_v2", 64)),
    Entry("classification", "mobilenet_v3_small", _classifier("mobilenet_v3_small", 64)),
    Entry("classification", "efficientnet_b0", _classifier("efficientnet_b0", 64)),
    # 128: at 64 its 15 last blocks see 2x2 maps, whose batch-norm statistics from 4 values make the
    # random network chaotic (onnxruntime's fp32 is itself 1-cos 0.19 from a float64 evaluation)
    Entry("classification", "efficientnet_v2_s", _classifier("efficientnet_v2_s", 128)),
    Entry("classification", "regnet_y_400mf", _classifier("regnet_y_400mf", 64)),
    Entry("classification", "shufflenet_v2", _classifier("shufflenet_v2_x0_5", 64)),
    Entry("classification", "squeezenet", _classifier("squeezenet1_1", 64)),
    Entry("classification", "mnasnet", _classifier("mnasnet0_5", 64)),
    Entry("classification", "densenet121", _classifier("densenet121", 64)),
    Entry("classification", "googlenet", _classifier("googlenet", 64, aux_logits=False, init_weights=True)),
    Entry("classification", "inception_v3", _classifier("inception_v3", 96, aux_logits=False, init_weights=True)),
    Entry("classification", "convnext_tiny", _classifier("convnext_tiny", 64)),
    Entry("classification", "vit_small", _vit_small, ci=True),
    Entry("classification", "swin_t_small", _swin(1)),
    Entry("classification", "swin_v2_t_small", _swin(2)),
    Entry("classification", "maxvit_small", _maxvit),
    # segmentation
    Entry("segmentation", "fcn_resnet50", _segmentation("fcn_resnet50", 64)),
    Entry("segmentation", "deeplabv3_mobilenet_v3_large", _segmentation("deeplabv3_mobilenet_v3_large", 64)),
    Entry("segmentation", "lraspp_mobilenet_v3_large", _segmentation("lraspp_mobilenet_v3_large", 64), ci=True),
    # detection
    Entry("detection", "fasterrcnn_mobilenet_v3_large_320_fpn", _detection("fasterrcnn_mobilenet_v3_large_320_fpn")),
    # RetinaNet's and FCOS's random heads score every anchor near their 0.01 prior, below the default
    # thresholds (0.05, 0.2): nothing would be detected, so nothing after the NMS compared
    Entry("detection", "retinanet_resnet50_fpn", _detection("retinanet_resnet50_fpn", min_size=320, max_size=320,
                                                           score_thresh=0.01)),
    Entry("detection", "ssdlite320_mobilenet_v3_large", _detection("ssdlite320_mobilenet_v3_large"), ci=True),
    Entry("detection", "fcos_resnet50_fpn", _detection("fcos_resnet50_fpn", min_size=320, max_size=320,
                                                       score_thresh=0.01)),
    Entry("detection", "keypointrcnn_resnet50_fpn", _detection("keypointrcnn_resnet50_fpn", min_size=320, max_size=320,
                                                              num_keypoints=5)),
    # its masks, [N, 1, 320, 320], pasted by a TorchScript Loop that grows one mask per detection
    # from an empty start (the exported file declares the start's shape): compared over matched pairs
    Entry("detection", "maskrcnn_resnet50_fpn", _detection("maskrcnn_resnet50_fpn", min_size=320, max_size=320)),
    # optical flow
    Entry("optical-flow", "raft_small", _raft, ci=True),
    # video
    Entry("video", "r3d_18", _video("r3d_18", 4, 32), ci=True),
    Entry("video", "mc3_18", _video("mc3_18", 4, 32)),
    Entry("video", "r2plus1d_18", _video("r2plus1d_18", 4, 32)),
    Entry("video", "s3d", _video("s3d", 16, 224)),  # its smallest: the head pools a fixed 2x7x7 window
    Entry("video", "mvit_v2_small", _mvit_v2_small),
    Entry("video", "swin3d_t", _video("swin3d_t", 4, 64)),
]

__all__ = ["ENTRIES"]
