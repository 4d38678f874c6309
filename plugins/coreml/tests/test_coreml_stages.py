"""The Core ML stages follow the stage contract: typed parameters built from the recipe, module-level
bodies, the kinds and libraries that decide each output declared; the core validates the package
through the backend's candidates."""

from __future__ import annotations

import inspect
import platform

import pytest

from edgebuild.plugin import Candidate, Skipped, StageParams, get_registry
from test_plan_readonly import conv_model

RECIPE = """\
edgebuild: 1
name: contract
source:
  model: conv.onnx
  inputs: {x: {shape: [1, 3, 16, 16], dtype: float32}}
target: {backend: coreml, deployment_target: iOS18, precision: float16}
compression: {auto: {max_size_mb: 1.0}}
validate:
  samples: 6
  inputs: {x: {random: {low: 0.0, high: 1.0, seed: 0}}}
outputs: {dir: out}
"""


@pytest.fixture
def variant(tmp_path):
    from edgebuild.build.jobs import load_variants

    conv_model(tmp_path / "conv.onnx")
    (tmp_path / "contract.yaml").write_text(RECIPE)
    (one,) = load_variants([str(tmp_path / "contract.yaml")], None, get_registry())
    return one


def test_stages_are_typed_module_level_and_name_what_decides_them(variant):
    backend = get_registry().get("backends", "coreml")
    stages = backend.stages(variant, get_registry())
    assert [s.name for s in stages] == ["lower", "compress", "package"]  # the core adds validate
    for stage in stages:
        assert isinstance(stage.params, StageParams)
        assert inspect.isfunction(stage.body) and stage.body.__qualname__ == stage.body.__name__, stage.name
        assert "coremltools" in stage.libraries and stage.uses
    lower, compress, package = stages
    assert lower.uses == ("lowerings",) and {"onnx", "onnx-ir", "numpy"} <= set(lower.libraries)
    assert lower.params.calibration.section.samples == 4  # the fp16 guard reads four of the six
    assert compress.deps == ["lower", "optimize"] and compress.params.calibration.section.samples == 6
    assert package.params.packaged == "compress" and package.extra["artifact"] == "model.mlpackage"
    assert "edgebuild" in package.params.metadata.versions


def test_a_changed_field_changes_the_key_params(variant):
    from edgebuild_coreml.stages import lower_params_of

    before = lower_params_of(variant).key_params()
    variant.recipe.compute.policy = "cpu_only"
    assert lower_params_of(variant).key_params() != before


def test_candidates_skip_core_ml_off_macos(tmp_path):
    backend = get_registry().get("backends", "coreml")
    # (the interpreter's candidate reads the package: the validation tests build one)
    found = backend.candidates(tmp_path / "model.mlpackage", ("coreml",), precision="float16",
                               emulate_fp16=False, built={"lower": {}}, registry=get_registry())
    if platform.system() != "Darwin":
        assert found == {"coreml": Skipped(found["coreml"].reason)} and "macOS" in found["coreml"].reason
    else:
        assert all(isinstance(c, Candidate) and not c.parallel for c in found.values())
    sessions = backend.sessions(tmp_path / "model.mlpackage", ("interpreter", "coreml"), registry=get_registry())
    assert callable(sessions["interpreter"])
    assert backend.validation_inputs == ("lower",) and backend.validation_libraries == ("coremltools",)
