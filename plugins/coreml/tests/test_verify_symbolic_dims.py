"""``edgebuild verify`` of a real .mlpackage whose source model has a symbolic batch dim: both sides
run at the package's input shape (the recipe pinned it), not at a batch of 1 the package refuses."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("coremltools")

RECIPE = """\
edgebuild: 1
name: tiny
source:
  model: tiny.onnx
  inputs: {x: {shape: [3, 4], dtype: float32}}
target: {backend: coreml, precision: float32}
validate: {samples: 2}
outputs: {dir: out}
"""


def test_verify_a_package_of_a_symbolic_batch_source(tmp_path, monkeypatch, cli):
    from edgebuild_testplugin.models import tiny_model

    from edgebuild_coreml.runtime import package_input_shapes

    tiny_model(tmp_path / "tiny.onnx")  # x: [n, 4]
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    monkeypatch.setenv("EDGEBUILD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("run", "recipe.yaml")
    assert code == 0, err
    package = tmp_path / "out" / "default" / "model.mlpackage"
    assert package_input_shapes(package) == {"x": [3, 4]}
    code, out, err = cli("verify", package, "--reference", "tiny.onnx", "--samples", "2", "--json")
    assert code == 0, err
    record = json.loads(out)
    assert record["failures"] == []
    [metrics] = record["runtimes"].values()
    assert metrics["metrics"]["y"]["compared"]["min"] == 12  # the package's batch of 3, every element finite
