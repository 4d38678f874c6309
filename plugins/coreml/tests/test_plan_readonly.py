"""``edgebuild plan`` is read-only: it never adds to the store, and the lowering's cache key holds
only what changes the lowered artifact.

The compute plan needs a lowered program: it is taken from the store when there, else lowered
into a temporary directory that is removed, so a second plan still says the stages would run.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

RECIPE = """\
edgebuild: 1
name: planned
source:
  model: conv.onnx
  inputs: {{x: {{shape: [1, 3, 16, 16], dtype: float32}}}}
target: {{backend: coreml, deployment_target: iOS17, precision: float16}}
compute: {{policy: cpu_and_ne}}
validate:
  samples: {samples}
  inputs: {{x: {{random: {{low: 0.0, high: 1.0, seed: 0}}}}}}
  thresholds: {{cosine_min: 0.99}}
outputs: {{dir: out}}
"""


def conv_model(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
        [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.fixture
def project(tmp_path, monkeypatch):
    conv_model(tmp_path / "conv.onnx")
    monkeypatch.chdir(tmp_path)

    def write(samples: int = 8) -> Path:
        path = tmp_path / "planned.yaml"
        path.write_text(RECIPE.format(samples=samples))
        return path

    return write


def plan(recipe: Path, cache: Path, capsys) -> dict:
    from edgebuild.cli.plan import plan_recipe

    plan_recipe(str(recipe), cache_dir=str(cache), as_json=True)
    return json.loads(capsys.readouterr().out)


def store_files(cache: Path) -> dict[str, int]:
    """Every file of the store's entries and temporaries, with its mtime."""
    return {str(p.relative_to(cache)): p.stat().st_mtime_ns
            for sub in ("objects", "tmp") for p in (cache / sub).rglob("*")}


def rows(data: dict) -> dict[str, dict]:
    (variant,) = data["variants"]
    return {row["name"]: row for row in variant["stages"]}


def test_plan_twice_on_a_fresh_cache_leaves_the_store_empty(project, tmp_path, capsys, monkeypatch):
    import tempfile

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where the plan lowers
    recipe, cache = project(), tmp_path / "cache"
    for _ in range(2):
        data = plan(recipe, cache, capsys)
        assert data["ops"] and {op["op"] for op in data["ops"]} >= {"conv"}  # the compute plan was made
        stages = rows(data)
        assert [stages[name]["status"] for name in ("import", "optimize", "lower", "package", "validate")] == \
            ["would run"] * 5
        assert store_files(cache) == {}, "plan wrote into the store"
    # (coremltools keeps temporaries of its own until the process exits; ours are gone already)
    assert not list(scratch.glob("edgebuild-plan-*")), "the temporary lowering was left behind"


def test_plan_after_a_build_reads_the_store_and_changes_nothing(project, tmp_path, capsys):
    from rich.console import Console

    from edgebuild.build.run import run_recipes

    recipe, cache = project(samples=8), tmp_path / "cache"
    assert run_recipes([str(recipe)], cache_dir=str(cache), console=Console(file=io.StringIO())) == 0
    capsys.readouterr()
    built = store_files(cache)
    stages = rows(plan(recipe, cache, capsys))
    assert {row["status"] for row in stages.values()} == {"cached"}
    assert store_files(cache) == built  # not one entry added, touched or rewritten

    # More validation samples change validation, not the lowered program (the fp16 guard reads four).
    more = rows(plan(project(samples=16), cache, capsys))
    assert more["lower"]["status"] == "cached" and more["lower"]["key"] == stages["lower"]["key"]
    assert more["validate"]["status"] == "would run" and "validate" in more["validate"]["reason"]
    # Fewer than four do change what the guard calibrates on, so they change the lowering's key.
    fewer = rows(plan(project(samples=2), cache, capsys))
    assert fewer["lower"]["status"] == "would run" and "calibration" in fewer["lower"]["reason"]
    assert store_files(cache) == built


def test_lower_key_ignores_validation_samples_beyond_what_the_fp16_guard_reads(project, tmp_path):
    from edgebuild.recipe import load_recipe
    from edgebuild_coreml.compute import FP16_GUARD_SAMPLES
    from edgebuild_coreml.stages import lower_params_of

    def lower_params(samples: int) -> dict:
        (variant,) = load_recipe(str(project(samples=samples)))
        return lower_params_of(variant).key_params()

    assert lower_params(FP16_GUARD_SAMPLES) == lower_params(32) == lower_params(FP16_GUARD_SAMPLES + 1)
    assert lower_params(FP16_GUARD_SAMPLES - 1) != lower_params(FP16_GUARD_SAMPLES)
