"""A scripted PyTorch module whose data decides the shape of a branch's result builds and matches onnxruntime.

``torch.jit.script`` keeps Python control flow, and ``torch.onnx.export`` writes it as an If whose
branches give the gate ``[1, 6]`` (a mean kept 2-D) or ``[6]`` (a max over the same axis): onnxruntime
runs it, MIL's ``cond`` needs one type. The unify_if_branches pass makes the ``[6]`` branch end in
``[1, 6]`` (its reader broadcasts), and the build validates on samples that take both branches.
Without the pass the Core ML lowering declines the If naming both shapes. The build runs under -m slow.
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

torch = pytest.importorskip("torch")

from onnx_cases import lower  # noqa: E402

from edgebuild.recipe.validation import ValidateSection  # noqa: E402
from edgebuild.verify.inputs import generate_inputs  # noqa: E402
from edgebuild_coreml.lowering.errors import DeclinedForm  # noqa: E402

VALIDATE = {"samples": 8, "inputs": {"x": {"random": {"low": -1.0, "high": 1.0, "seed": 0}}},
            "thresholds": {"cosine_min": 0.9999}}


class Gate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(6, 6)

    def forward(self, x):
        h = self.proj(x)
        if bool(x.mean() > 0):
            g = h.mean(0, keepdim=True)  # [1, 6]
        else:
            g = h.amax(0)  # [6]
        return torch.sigmoid(h * g)


@pytest.fixture(scope="module")
def gate_onnx(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gate") / "gate.onnx"
    torch.manual_seed(0)
    scripted = torch.jit.script(Gate().eval())
    torch.onnx.export(scripted, (torch.randn(4, 6),), str(path), input_names=["x"], output_names=["y"],
                      dynamo=False, opset_version=17)
    return path


def _branch_shapes(path: Path) -> list[list[int]]:
    model = onnx.load(str(path))
    [node] = [n for n in model.graph.node if n.op_type == "If"]
    graphs = {a.name: a.g for a in node.attribute}
    return [[d.dim_value for d in graphs[b].output[0].type.tensor_type.shape.dim] for b in ("then_branch", "else_branch")]


def test_exported_if_gives_two_shapes_and_the_lowering_alone_declines_it(gate_onnx):
    assert _branch_shapes(gate_onnx) == [[1, 6], [6]]
    with pytest.raises(DeclinedForm) as declined:
        lower(onnx.load(str(gate_onnx)))
    assert "output 0 is [1, 6] in then_branch and [6] in else_branch" in str(declined.value)


@pytest.mark.slow
def test_builds_and_matches_onnxruntime_on_both_branches(gate_onnx, tmp_path):
    samples = generate_inputs(ValidateSection(**VALIDATE), {"x": {"shape": [4, 6], "dtype": "float32"}}, tmp_path)
    taken = {bool(np.asarray(sample["x"]).mean() > 0) for sample in samples}
    assert taken == {True, False}, "the validation samples must take both branches"
    recipe = tmp_path / "gate.yaml"
    recipe.write_text(json.dumps({
        "edgebuild": 1, "name": "gate_if",
        "source": {"model": str(gate_onnx), "inputs": {"x": {"shape": [4, 6], "dtype": "float32"}}},
        "target": {"backend": "coreml", "deployment_target": "iOS17", "precision": "float32"},
        "validate": VALIDATE, "outputs": {"dir": "out"}}))
    done = subprocess.run([sys.executable, "-m", "edgebuild.cli.app", "run", str(recipe), "--json", "--cache-dir",
                           str(tmp_path / "cache")], capture_output=True, text=True, cwd=tmp_path, timeout=900,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert done.stdout.strip(), done.stderr[-3000:]
    [record] = json.loads(done.stdout)["variants"]
    assert record["status"] == "built", f"{record.get('error')}\n{done.stderr[-3000:]}"
    metrics = record["validation"]["runtimes"]["interpreter"]["metrics"]["y"]
    assert metrics["cosine"]["min"] >= 0.9999
