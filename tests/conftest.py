"""Shared fixtures: tiny generated ONNX models and recipe files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]


def tiny_model(path: Path, scale: float = 2.0) -> Path:
    """y = relu(x * w + b): enough graph for import and optimise to do real work."""
    w = numpy_helper.from_array(np.full((4,), scale, dtype=np.float32), "w")
    b = numpy_helper.from_array(np.arange(4, dtype=np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"])],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return path


RECIPE = """\
edgebuild: 1
name: tiny
source:
  model: tiny.onnx
  inputs: {{x: {{shape: [2, 4], dtype: float32}}}}
target: {{backend: testcopy, precision: float32}}
{extra}
outputs: {{dir: out}}
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A directory with tiny.onnx and a recipe using the test plugin's backend."""
    tiny_model(tmp_path / "tiny.onnx")
    monkeypatch.setenv("EDGEBUILD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("EDGEBUILD_TEST_LOG", str(tmp_path / "log.txt"))
    monkeypatch.chdir(tmp_path)

    def write(extra: str = "", name: str = "recipe.yaml") -> Path:
        path = tmp_path / name
        path.write_text(RECIPE.format(extra=extra))
        return path

    return write


def edgebuild(*args, env=None, cwd=None, check=None):
    """Run the CLI in a subprocess, as a user would."""
    done = subprocess.run([sys.executable, "-m", "edgebuild.cli.app", *map(str, args)], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, cwd=cwd)
    if check is not None:
        assert done.returncode == check, done.stderr + done.stdout
    return done


def run_until_stage(recipe: Path, log: Path, stage: str, *, sleep: int) -> subprocess.Popen:
    """``edgebuild run RECIPE`` in the background, the test plugin pausing ``sleep`` s in each
    stage, returned once ``log`` (EDGEBUILD_TEST_LOG) shows ``stage`` has started."""
    import time

    env = {**os.environ, "EDGEBUILD_TEST_SLEEP": str(sleep)}
    proc = subprocess.Popen([sys.executable, "-m", "edgebuild.cli.app", "run", str(recipe)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 2 * sleep
    while f"{stage}:start" not in log_lines(log):
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.1)
    return proc


def log_lines(path: Path) -> list[str]:
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []
