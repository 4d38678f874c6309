"""The Python API on Core ML builds: validation metrics come back typed, and ``check()``
raises the CLI's errors for missed thresholds and for a stage that failed."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

import edgebuild
from edgebuild.api import Validation
from edgebuild.errors import BuildError, ValidationFailed
from edgebuild_testplugin.models import tiny_model


@pytest.fixture
def coreml_project(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEBUILD_CACHE_DIR", str(tmp_path / "cache"))
    tiny_model(tmp_path / "tiny.onnx")

    def write(thresholds: str, precision: str = "float32") -> Path:
        path = tmp_path / "r.yaml"
        path.write_text(
            "edgebuild: 1\nname: tiny\nsource: {model: tiny.onnx, inputs: {x: {shape: [2, 4], dtype: float32}}}\n"
            f"target: {{backend: coreml, precision: {precision}}}\nvalidate: {{samples: 2, thresholds: {thresholds}}}\n"
            "outputs: {dir: out}\n")
        return path

    return write


def test_validation_metrics_are_returned_and_check_raises_on_missed_thresholds(coreml_project):
    result = edgebuild.build(coreml_project("{cosine_min: 0.999}")).check()
    validation = result["default"].validation
    assert isinstance(validation, Validation) and validation.passed and validation.samples == 2
    assert validation.metrics["interpreter"]["y"]["cosine"]["min"] > 0.999
    # a limit fp16 rounding cannot meet: built, measured, failed, and check() raises the CLI's exit-3 error
    failed = edgebuild.build(coreml_project("{max_abs_max: 0.0}", precision="float16"))
    assert not failed.ok and failed.exit_code == 3 and failed["default"].status == "failed"
    assert failed["default"].validation.failures
    with pytest.raises(ValidationFailed):
        failed.check()


def test_check_raises_build_error_for_a_failed_stage(coreml_project, tmp_path):
    # valid ONNX with an op no plugin lowers: the recipe loads, the lower stage fails
    recipe = coreml_project("{}")
    model = onnx.load(tmp_path / "tiny.onnx")
    model.graph.node[-1].op_type, model.graph.node[-1].domain = "Mystery", "com.example"
    model.opset_import.append(onnx.helper.make_opsetid("com.example", 1))
    onnx.save(model, tmp_path / "tiny.onnx")
    result = edgebuild.build(recipe)
    assert result.exit_code == 1 and result["default"].error
    with pytest.raises(BuildError):
        result.check()
