"""Public architectures whose graphs hold rank-6 values build and validate (lowering.rank).

torchvision's Swin, Swin V2 and MaxViT partition images into windows through rank-6 reshapes and
transposes; RAFT scales its correlation volume as a rank-6 tensor; transformers' Hiera unrolls its
tokens through rank-6 values it splits, squeezes and max-pools. Each is built from its published
constructor with random weights, small, and exported with ``torch.onnx.export`` (the TorchScript
exporter, opset 17: the dynamo exporter fails on RAFT) as a user would; before the rank
legalisation coremltools stopped every one of them ("Core ML only supports tensors with rank <= 5").

A tiny Swin (one stage: a window block and a shifted-window block) is lowered and run against
onnxruntime by default; the four architectures go through ``edgebuild run`` at fp32 and fp16 under
-m slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx_cases import lower, run_onnxruntime

from edgebuild_coreml.lowering.rank import MAX_RANK

FP32_COSINE = 0.9999
FP16_COSINE = 0.999


def _architecture(name: str):
    """(module, example inputs) of ``name``, seeded, small where the constructor allows."""
    import torch
    from edgebuild_testplugin.torchvision_models import torchvision
    from torchvision.models import maxvit, swin_transformer

    torch.manual_seed(0)
    image = torch.rand(1, 3, 64, 64)
    small_swin = dict(patch_size=[4, 4], embed_dim=24, depths=[2, 2], num_heads=[2, 4], window_size=[4, 4],
                      num_classes=10)
    if name == "swin_tiny":  # one stage: the CI case
        return swin_transformer.SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2], num_heads=[2],
                                                window_size=[4, 4], num_classes=10), (torch.rand(1, 3, 32, 32),)
    if name == "swin_t":
        return swin_transformer.SwinTransformer(**small_swin), (image,)
    if name == "swin_v2_t":
        return swin_transformer.SwinTransformer(**small_swin, block=swin_transformer.SwinTransformerBlockV2,
                                                downsample_layer=swin_transformer.PatchMergingV2), (image,)
    if name == "maxvit_t":
        return maxvit.MaxVit(input_size=(64, 64), stem_channels=16, partition_size=4, block_channels=[16, 32],
                             block_layers=[1, 1], head_dim=8, stochastic_depth_prob=0.0, num_classes=10), (image,)
    if name == "hiera":  # transformers' Hiera: unrolls and re-rolls its tokens through rank-6 values
        from transformers import HieraConfig, HieraModel

        config = HieraConfig(embed_dim=16, image_size=[64, 64], patch_size=[7, 7], patch_stride=[4, 4],
                             patch_padding=[3, 3], depths=[1, 1, 1, 1], num_heads=[1, 2, 2, 2], query_stride=[2, 2],
                             masked_unit_size=[8, 8], mlp_ratio=2.0)
        hiera = HieraModel(config)

        class LastHidden(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.hiera = hiera

            def forward(self, pixel_values):
                return self.hiera(pixel_values=pixel_values).last_hidden_state

        return LastHidden(), (image,)
    if name == "raft_small":
        raft = torchvision.models.optical_flow.raft_small(weights=None)

        class LastFlow(torch.nn.Module):  # the final flow estimate, after two refinement steps
            def __init__(self):
                super().__init__()
                self.raft = raft

            def forward(self, first, second):
                return self.raft(first, second, num_flow_updates=2)[-1]

        # RAFT's correlation pyramid needs feature maps of 16 or more: images of 128 or more
        return LastFlow(), (torch.rand(1, 3, 128, 128), torch.rand(1, 3, 128, 128))
    raise KeyError(name)


def _export(name: str, directory: Path) -> tuple[Path, dict]:
    import torch

    module, args = _architecture(name)
    path = directory / f"{name}.onnx"
    names = [f"input{i}" for i in range(len(args))]
    torch.onnx.export(module.eval(), args, str(path), opset_version=17, dynamo=False, input_names=names)
    return path, {n: a.numpy() for n, a in zip(names, args)}


def _highest_onnx_rank(path: Path) -> int:
    inferred = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    ranks = [len(v.type.tensor_type.shape.dim) for v in inferred.graph.value_info if v.type.tensor_type.HasField("shape")]
    return max(ranks)


def _cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_tiny_swin_window_attention_lowers_and_matches_onnxruntime(tmp_path):
    from edgebuild_coreml.interpreter import run_program

    path, inputs = _export("swin_tiny", tmp_path)
    assert _highest_onnx_rank(path) == 6  # the window partition, as torchvision exports it
    model = onnx.load(str(path))
    result = lower(model, target="iOS17")
    program = result.program
    assert max(o.rank for op in program.functions["main"].operations for o in op.outputs if hasattr(o, "rank")) <= MAX_RANK
    program._check_invalid_tensor_rank()
    produced = run_program(program, {result.input_names[k]: v for k, v in inputs.items()})
    expected = run_onnxruntime(model, inputs)
    for name, reference in expected.items():
        assert _cosine(produced[result.output_names[name]], reference) >= FP32_COSINE, name


def _run(recipe: Path, cache: Path) -> list[dict]:
    done = subprocess.run(
        [sys.executable, "-m", "edgebuild.cli.app", "run", str(recipe), "--cache-dir", str(cache), "--json"],
        capture_output=True, text=True, cwd=recipe.parent, env=dict(os.environ, PYTHONWARNINGS="ignore"), timeout=1800,
    )
    assert done.stdout.strip(), f"no JSON on stdout (exit {done.returncode}):\n{done.stderr[-3000:]}"
    return json.loads(done.stdout)["variants"]


def _recipe(name: str, path: Path, inputs: dict, directory: Path) -> Path:
    shapes = ", ".join(f"{n}: {{shape: {list(a.shape)}, dtype: float32}}" for n, a in inputs.items())
    feeds = ", ".join(f"{n}: {{random: {{low: 0.0, high: 1.0, seed: {i}}}}}" for i, n in enumerate(inputs))
    recipe = directory / f"{name}.yaml"
    recipe.write_text(
        "edgebuild: 1\n"
        f"name: {name}\n"
        f"source: {{model: {json.dumps(str(path))}, inputs: {{{shapes}}}}}\n"
        "target: {deployment_target: iOS17, precision: float32}\n"
        f"validate: {{samples: 2, inputs: {{{feeds}}}, thresholds: {{cosine_min: {FP32_COSINE}}}}}\n"
        "variants:\n"
        "  fp32: {}\n"
        f"  fp16: {{target: {{precision: float16}}, validate: {{thresholds: {{cosine_min: {FP16_COSINE}}}}}}}\n"
        "outputs: {dir: out}\n"
    )
    return recipe


@pytest.mark.slow
@pytest.mark.parametrize("name", ["swin_t", "swin_v2_t", "maxvit_t", "raft_small", "hiera"])
def test_rank_six_architecture_builds_and_validates_at_fp32_and_fp16(name, tmp_path):
    path, inputs = _export(name, tmp_path)
    assert _highest_onnx_rank(path) == 6
    records = {r["variant"]: r for r in _run(_recipe(name, path, inputs, tmp_path), tmp_path / "cache")}
    for variant, limit in (("fp32", FP32_COSINE), ("fp16", FP16_COSINE)):
        record = records[variant]
        assert record["status"] == "built", f"{name} {variant}: {record.get('error')}"
        metrics = record["validation"]["runtimes"]["interpreter"]["metrics"]
        cosines = {output: values["cosine"]["min"] for output, values in metrics.items()}
        print(f"\n{name} {variant}: worst cosine {cosines}")
        assert cosines and min(cosines.values()) >= limit
