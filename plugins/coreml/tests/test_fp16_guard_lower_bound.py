"""The fp16 guard holds the lower end of its estimate, so its islands pass under either kernel set.

Real nets (torch modules exported with ``torch.onnx.export``) whose fp16 error sits in one place:
a value offset far from zero and taken back a few ops later, as a batch norm folded into a conv
with a bias that cancels most of its product. fp16 rounds the offset value to a step as large as
the signal left after the cancellation. The place is enumerated over where such nets have it: the
input itself (pixels around 100 that the stem centres), a squeeze-and-excitation gate's logits, and
the classifier head. Each builds at fp16 through ``edgebuild run`` (the lower stage's guard, at its
call site); the artifact then runs under the interpreter's numpy kernels and its torch kernels,
which sum in different orders, and both stay within cosine_min against onnxruntime.

A program whose fp16 error is spread over every op is the other side: no island set within the
cap reaches the budget, and the result says so, with the cap and the lower end it reached.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from recipe_runs import run_built

from edgebuild_coreml import fp16_guard
from edgebuild_coreml.fp16_sensitivity import BUDGET_SHARE, MAX_KEPT_SHARE

COSINE_MIN = 0.999
SHAPE = (1, 3, 16, 16)
# fp16's step at 1024 is 0.5, at 256 0.125: the signal a cancellation leaves is about 1
OFFSET = {"gate": 1024.0, "head": 256.0}
INPUT_LOW = {"input": 1000.0, "gate": 0.0, "head": 0.0}  # the input variant's readings sit around 1000


def _module(place: str):
    import torch
    from torch import nn

    class Cancelling(nn.Module):
        """conv(h + offset) - conv(offset) (its bias aside): conv(h) in exact arithmetic, a folded norm's
        cancelling bias in effect, and fp16's rounding of h + offset in fp16."""

        def __init__(self, conv: nn.Conv2d, offset: float):
            super().__init__()
            self.conv, self.offset = conv, offset
            with torch.no_grad():
                taken = nn.functional.conv2d(torch.full((1, conv.in_channels, 1, 1), offset), conv.weight)
            self.register_buffer("taken", taken)

        def forward(self, h):
            return self.conv(h + self.offset) - self.taken

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            # no biases: a constant part of the outputs would hide their error from the cosine
            self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
            self.body = nn.Conv2d(8, 16, 3, padding=1, bias=False)
            self.squeeze = nn.Conv2d(16, 4, 1, bias=False)
            self.excite = nn.Conv2d(4, 16, 1, bias=False)
            self.head = nn.Conv2d(16, 10, 1, bias=False)
            if place == "gate":
                self.excite = Cancelling(self.excite, OFFSET["gate"])
            if place == "head":
                self.head = Cancelling(self.head, OFFSET["head"])

        def forward(self, x):
            if place == "input":  # the stem centres the readings
                x = x - INPUT_LOW["input"]
            h = nn.functional.silu(self.stem(x))
            h = nn.functional.silu(self.body(h))
            gate = torch.sigmoid(self.excite(nn.functional.silu(self.squeeze(h.mean((2, 3), keepdim=True)))))
            return self.head(h * gate).flatten(1)  # a dense prediction: no average hides a pixel's error

    torch.manual_seed(0)
    return Net().eval()


def _export(place: str, path: Path) -> Path:
    import torch

    torch.onnx.export(_module(place), (torch.zeros(SHAPE),), str(path), input_names=["x"], output_names=["logits"],
                      dynamo=False, opset_version=17)
    return path


def _build(model: Path, place: str, workdir: Path) -> dict:
    low = INPUT_LOW[place]
    recipe = workdir / "net.yaml"
    recipe.write_text(
        "edgebuild: 1\nname: net\n"
        f"source: {{model: {json.dumps(str(model))}, inputs: {{x: {{shape: {list(SHAPE)}, dtype: float32}}}}}}\n"
        "target: {backend: coreml, deployment_target: iOS17, precision: float16}\n"
        "validate:\n  samples: 2\n"
        f"  inputs: {{x: {{random: {{low: {low}, high: {low + 1.0}, seed: 0}}}}}}\n"
        f"  thresholds: {{cosine_min: {COSINE_MIN}}}\n"
        "outputs: {dir: out}\n"
    )
    record, report = run_built(recipe, workdir)
    return {"package": workdir / "out" / record["variant"] / "model.mlpackage", "guard": report["lower"]}


def _cosine(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _artifact_cosines(package: Path, model: Path, low: float) -> dict[str, float]:
    """The artifact's worst cosine against onnxruntime on fresh samples, under each kernel set."""
    import onnxruntime

    from edgebuild_coreml.interpreter import torch_kernels
    from edgebuild_coreml.interpreter.artifact_runner import ArtifactRunner
    from edgebuild_coreml.interpreter.plan import forget_plans

    rng = np.random.default_rng(7)  # other samples than the guard calibrated on
    samples = [{"x": (low + rng.random(SHAPE)).astype(np.float32)} for _ in range(3)]
    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    references = [session.run(None, sample)[0] for sample in samples]
    runner = ArtifactRunner(package)
    found = {}
    try:
        for kernels in ("numpy", "torch"):
            torch_kernels.disable()
            if kernels == "torch":
                assert torch_kernels.enable(1)
            forget_plans(runner.program)  # a plan holds the kernels it prepared
            found[kernels] = min(_cosine(reference, runner(sample)["logits"])
                                 for reference, sample in zip(references, samples))
    finally:
        torch_kernels.disable()
        forget_plans(runner.program)
    return found


@pytest.mark.parametrize("place", sorted(INPUT_LOW))
def test_islands_chosen_by_the_lower_end_pass_under_both_kernel_sets(place, tmp_path):
    model = _export(place, tmp_path / f"{place}.onnx")
    built = _build(model, place, tmp_path)
    precision = built["guard"]["fp16_guard"]["precision"]
    assert precision["estimated_fp16_cosine"] < COSINE_MIN  # fp16 alone fails: the place matters
    low, high = precision["estimate_range"]
    assert low >= COSINE_MIN and not precision["ill_conditioned"] and "capped_islands" not in precision
    kept = precision["kept_fp32"]
    assert kept and len(kept) <= MAX_KEPT_SHARE * sum(built["guard"]["op_counts"].values())
    if place == "input":  # the input reaches only kept ops: it is not cast at all
        assert any("Sub" in name or "sub" in name for name in kept)
    cosines = _artifact_cosines(built["package"], model, INPUT_LOW[place])
    assert set(cosines) == {"numpy", "torch"}
    for kernels, cosine in cosines.items():
        assert cosine >= COSINE_MIN, (kernels, cosine, precision)


def test_error_spread_over_every_op_is_named_with_the_cap_it_reached():
    """The logistic map at 3.99 on a two-element state: every op's rounding counts, so no share of
    them within MAX_KEPT_SHARE holds the lower end; the nearest-rounding choice is kept and named."""
    from coremltools.converters.mil import Builder as mb

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 2))])
    def chaotic(x):
        value = x
        for step in range(20):
            grown = mb.mul(x=value, y=np.float32(3.99), name=f"grown{step}")
            value = mb.mul(x=grown, y=mb.sub(x=np.float32(1.0), y=value, name=f"left{step}"), name=f"state{step}")
        return mb.mul(x=value, y=np.float32(1.0), name="out")

    rng = np.random.default_rng(1)
    samples = [{"x": (0.2 + 0.6 * rng.random((1, 2))).astype(np.float32)} for _ in range(2)]
    precision = fp16_guard.find_overflows(chaotic, samples, cosine_min=COSINE_MIN).precision
    found = precision.to_json()
    assert precision.ill_conditioned and found["ill_conditioned"] is True
    capped = found["capped_islands"]
    assert 0 < capped["max_ops"] <= MAX_KEPT_SHARE * 61
    assert capped["estimated_lower_cosine"] < 1 - (1 - COSINE_MIN) * BUDGET_SHARE
    assert precision.kept_cosine >= 1 - (1 - COSINE_MIN) * BUDGET_SHARE  # the nearest-rounding choice
