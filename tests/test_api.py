"""The Python API: ``edgebuild.build`` returns typed results, a bad recipe raises a typed error,
and ``import edgebuild`` loads none of the build machinery."""

from __future__ import annotations

import subprocess
import sys

import pytest

import edgebuild
from edgebuild.api import BuildResult, StageStatus, VariantResult
from edgebuild.errors import RecipeError


def test_build_returns_typed_results_and_reports_cached_stages(project):
    recipe = project("variants: {a: {}, b: {target: {precision: float16}}}")
    result = edgebuild.build(recipe, variant="a")
    assert isinstance(result, BuildResult) and result.ok and len(result) == 1
    built = result["a"]
    assert isinstance(built, VariantResult) and built.status == "built"
    assert built.artifact == built.output_dir / "model" and built.artifact.is_dir()
    assert all(isinstance(s, StageStatus) for s in built.stages)
    assert {s.name: s.status for s in built.stages}["lower"] == "ran"
    again = edgebuild.build(recipe, variant=["a", "b"])
    assert {s.status for s in again["a"].stages} == {"cached"}
    assert again["b"].output_dir.name == "b" and len(again.artifacts) == 2
    with pytest.raises(KeyError, match="no variant 'c'"):
        again["c"]


def test_bad_recipe_raises_recipe_error_with_its_location(project):
    recipe = project("validate: {samples: 0}")
    with pytest.raises(RecipeError) as caught:
        edgebuild.build(recipe)
    assert "recipe.yaml:" in str(caught.value) and "samples" in str(caught.value)
    assert caught.value.exit_code == 2


def test_load_recipe_and_dict_recipes(project, tmp_path):
    loaded = edgebuild.load_recipe(project("variants: {x: {}, y: {}}"))
    assert loaded.names == ["x", "y"] and loaded["x"].recipe.target.backend == "testcopy"
    data = {"edgebuild": 1, "name": "fromdict", "source": {"model": "tiny.onnx",
            "inputs": {"x": {"shape": [2, 4], "dtype": "float32"}}},
            "target": {"backend": "testcopy", "precision": "float32"}, "outputs": {"dir": "dictout"}}
    result = edgebuild.build(data, base_dir=tmp_path)
    assert result.ok and result["default"].output_dir == (tmp_path / "dictout" / "default").resolve()
    assert not list(tmp_path.glob(".edgebuild-recipe-*"))  # the temporary recipe file is gone
    with pytest.raises(RecipeError):
        edgebuild.load_recipe({**data, "target": {"backend": "testcopy", "precision": "int3"}}, base_dir=tmp_path)


def test_import_edgebuild_stays_cheap_and_build_stays_the_function():
    code = ("import sys, edgebuild; heavy = {'pydantic', 'typer', 'rich', 'onnx', 'numpy', 'edgebuild.api'};"
            "print(sorted(m for m in heavy if m in sys.modules));"
            "import edgebuild.build.jobs; from edgebuild.build.jobs import plan_jobs;"
            "print(callable(edgebuild.build) and edgebuild.build.__module__ == 'edgebuild')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[:2] == ["[]", "True"]
