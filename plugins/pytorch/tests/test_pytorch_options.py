"""Recipe options, input planning and plugin registration: no torch needed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from edgebuild.errors import RecipeError, UsageError
from edgebuild_pytorch.inputs import plan_inputs
from edgebuild_pytorch.loading import source_kind
from edgebuild_pytorch.options import PyTorchOptions


def test_registration_is_lazy_and_complete():
    code = (
        "import sys\n"
        "from edgebuild.registry import build_registry\n"
        "r = build_registry()\n"
        "f = r.get('frontends', 'pytorch')\n"
        "s = r.get('recipe_sections', 'pytorch:source.options')\n"
        "print(repr(f), s.__name__, 'torch' in sys.modules, r.plugin_of('frontends', 'pytorch').distribution)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["Lazy('edgebuild_pytorch.frontend:PyTorchFrontend')", "PyTorchOptions", "False", "edgebuild-pytorch"]


@pytest.mark.parametrize("options, message", [
    ({"factory": "no_colon_here"}, "not 'package.module:callable'"),
    ({"kind": "state_dict"}, "needs a factory"),
    ({"kind": "torchscript", "factory": "a.b:C"}, "drop the factory"),
    ({"route": "tflite"}, "route"),
    ({"opset": 9}, "opset"),
    ({"config_sha256": "0" * 64}, "without a config"),
    ({"facotry": "a:b"}, "facotry"),
])
def test_bad_options_are_rejected(options, message):
    with pytest.raises(ValidationError, match=message):
        PyTorchOptions.model_validate(options)


def test_defaults():
    options = PyTorchOptions()
    assert (options.route, options.opset, options.kind, options.factory_kwargs) == ("auto", 18, None, {})


@pytest.mark.parametrize("name, options, kind", [
    ("m.jit", {}, "torchscript"),
    ("m.pt", {}, "torchscript"),
    ("m.pt", {"factory": "a:B"}, "state_dict"),
    ("m.safetensors", {"factory": "a:B"}, "state_dict"),
    ("m.pt2", {}, "exported_program"),
    ("m.bin", {"kind": "exported_program"}, "exported_program"),
])
def test_kind_from_suffix_and_factory(name, options, kind):
    assert source_kind(Path(name), PyTorchOptions.model_validate(options)) == kind


def test_recipe_option_error_names_file_and_line(tmp_path):
    from edgebuild.build.jobs import load_variants
    from edgebuild.registry import get_registry

    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "edgebuild: 1\nname: r\nsource:\n  model: w.pt\n  inputs: {x: {shape: [1, 3]}}\n"
        "  options:\n    kind: state_dict\n    route: sideways\n"
    )
    with pytest.raises(RecipeError) as info:
        load_variants([str(recipe)], None, get_registry())
    assert "r.yaml:8" in str(info.value) and "route" in str(info.value)


def test_input_plan_splits_fixed_and_free_and_pins_flexible_dims():
    plan = plan_inputs({
        "x": {"shape": [1, {"range": [256, 1024], "default": 512}], "dtype": "float32"},
        "ids": {"shape": [1, {"enumerated": [64, 128]}], "dtype": "int64"},
        "sr": {"value": 16000, "dtype": "int64"},
    })
    assert plan.free == {"x": ([1, 512], "float32"), "ids": ([1, 64], "int64")}
    assert plan.fixed["sr"].dtype == np.int64 and int(plan.fixed["sr"]) == 16000
    arrays = plan.example_arrays()
    assert arrays["x"].shape == (1, 512) and arrays["x"].dtype == np.float32
    assert (arrays["ids"] == 1).all()


def test_input_without_shape_is_a_usage_error():
    with pytest.raises(UsageError, match=r"source.inputs.x: a PyTorch source needs the shape"):
        plan_inputs({"x": {"dtype": "float32"}})


def test_a_local_config_is_part_of_the_import_key_and_a_prerequisite(tmp_path, monkeypatch):
    from edgebuild.build.jobs import load_variants, local_inputs, plan_jobs
    from edgebuild.store.location import open_store
    from edgebuild.registry import build_registry

    monkeypatch.setenv("EDGEBUILD_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "weights.safetensors").write_bytes(b"not read while planning")
    config = tmp_path / "config.json"
    config.write_text('{"hidden": 4}')
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "edgebuild: 1\nname: cfg\nsource:\n  model: weights.safetensors\n  format: pytorch\n"
        "  options: {factory: 'mypkg.models:build', config: config.json}\n"
        "  inputs: {x: {shape: [1, 4], dtype: float32}}\ntarget: {backend: coreml}\n")
    registry = build_registry()

    def import_stage():
        (build,) = plan_jobs(load_variants([str(recipe)], None, registry), registry, open_store())
        return build, next(s for s in build.job.stages if s.name == "import")

    build, before = import_stage()
    assert list(before.params.option_files) == [str(config)]
    assert config in local_inputs(build)
    config.write_text('{"hidden": 8}')
    _, after = import_stage()
    assert after.params.option_files != before.params.option_files
    assert after.key_params()["option_files"] != before.key_params()["option_files"]  # and so the key
