"""``route: coreml`` in a process whose coremltools was imported lean (before torch, as a run that
lowered an ONNX variant first leaves it): the conversion moves to a fresh process and gives the
same program. Checked with the MIL interpreter against the eager module. The script has no main
guard: the fresh process must not run it again (multiprocessing's spawn would)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("coremltools")
pytest.importorskip("edgebuild_coreml")

import pytorch_test_factories as factories  # noqa: E402

TESTS = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow  # two fresh processes that import torch and coremltools
X = np.random.default_rng(5).standard_normal((1, 3, 8, 8)).astype(np.float32)

LEAN_THEN_ROUTE = """
import json, sys
with open(sys.argv[3], "a") as ran:
    ran.write("ran\\n")
import edgebuild_coreml.lowering.converter  # what lowering an ONNX variant imports
from coremltools import _deps
assert not _deps._HAS_TORCH and "torch" not in sys.modules
from pathlib import Path
from edgebuild_pytorch.coreml_route import coremltools_without_torch
from edgebuild_pytorch.frontend import PyTorchFrontend
report = PyTorchFrontend().import_model(Path(sys.argv[1]), {"x": {"shape": [1, 3, 8, 8]}}, Path(sys.argv[2]),
                                        options={"factory": "pytorch_test_factories:TinyNet", "route": "coreml"})
print(json.dumps({"lean": coremltools_without_torch(), "route": report["route"], "mil_ops": report["mil_ops"]}))
"""


def test_coreml_route_after_a_lean_coremltools_import(tmp_path):
    torch.manual_seed(2)
    module = factories.TinyNet().eval()
    weights, out = tmp_path / "tiny.pt", tmp_path / "out"
    torch.save(module.state_dict(), weights)
    with torch.no_grad():
        expected = {k: v.numpy() for k, v in module(torch.from_numpy(X)).items()}

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    script, ran = tmp_path / "script.py", tmp_path / "ran.txt"
    script.write_text(LEAN_THEN_ROUTE)
    done = subprocess.run([sys.executable, str(script), str(weights), str(out), str(ran)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert ran.read_text().splitlines() == ["ran"]  # the script's top level ran once, in its own process
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["lean"] and report["route"] == "coreml"
    assert report["mil_ops"].get("conv") == 1  # the counts come back from the converting process
    assert (out / "model.pt2").is_file()

    from edgebuild_coreml.interpreter import load_mlpackage, run_program

    got = run_program(load_mlpackage(out / "model.mlpackage"), {"x": X})
    for name in expected:
        np.testing.assert_allclose(np.asarray(got[name]), expected[name], rtol=1e-4, atol=1e-5)
