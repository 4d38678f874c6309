"""The validate stage runs every candidate the recipe names; Core ML is skipped off macOS, and says so."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


def _recipe(tmp_path, thresholds: str) -> None:
    w = numpy_helper.from_array(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Tanh", ["m"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), tmp_path / "m.onnx")
    (tmp_path / "r.yaml").write_text(
        "edgebuild: 1\nname: rt\nsource: {model: m.onnx, inputs: {x: {shape: [2, 4]}}}\n"
        "target: {backend: coreml, precision: float32}\n"
        f"validate: {{samples: 2, runtimes: [interpreter, coreml], thresholds: {thresholds}}}\noutputs: {{dir: out}}\n")


def _run(tmp_path):
    env = {**os.environ, "EDGEBUILD_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-m", "edgebuild.cli.app", "run", "r.yaml", "--json"], cwd=tmp_path,
                          env=env, capture_output=True, text=True)


@pytest.mark.skipif(platform.system() == "Darwin", reason="off macOS only")
def test_core_ml_is_recorded_as_skipped_beside_the_interpreter(tmp_path):
    _recipe(tmp_path, "{cosine_min: 0.99999}")
    done = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    runtimes = json.loads(done.stdout)["variants"][0]["validation"]["runtimes"]
    assert runtimes["coreml"] == {"skipped": "Core ML runs only on macOS; the interpreter's numbers stand in for it here"}
    assert runtimes["interpreter"]["metrics"]["y"]["cosine"]["min"] > 0.99999


def test_a_failing_threshold_exits_3_naming_runtime_output_and_metric(tmp_path):
    # fp16 rounding leaves errors near 1e-4, far above this limit (a cosine_min above 1 is a recipe error)
    _recipe(tmp_path, "{max_abs_max: 1.0e-9}")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(recipe.read_text().replace("precision: float32", "precision: float16"))
    done = _run(tmp_path)
    assert done.returncode == 3, done.stderr
    failures = json.loads(done.stdout)["variants"][0]["validation"]["failures"]
    assert {"output": "y", "runtime": "interpreter", "metric": "max_abs", "limit": 1e-9}.items() <= next(
        f for f in failures if f["metric"] == "max_abs").items(), failures


def test_editing_a_validation_input_file_reruns_validation_only(tmp_path):
    _recipe(tmp_path, "{cosine_min: 0.999}")
    np.save(tmp_path / "x.npy", np.ones((2, 2, 4), np.float32))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(recipe.read_text().replace("validate: {samples: 2,", "validate: {samples: 2, inputs: {x: {file: x.npy}},"))
    assert _run(tmp_path).returncode == 0
    np.save(tmp_path / "x.npy", np.full((2, 2, 4), 0.5, np.float32))
    done = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    statuses = {s["name"]: s["status"] for s in json.loads(done.stdout)["variants"][0]["stages"]}
    assert statuses == {"resolve": "cached", "import": "cached", "optimize": "cached", "lower": "cached",
                        "package": "cached", "validate": "ran"}
