"""``edgebuild convert MODEL -o OUT.mlpackage`` refuses bad options and never a path convert did
not write, before any build (Core ML is the default backend, so OUT is an .mlpackage)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgebuild_testplugin.cli_runner import edgebuild
from edgebuild_testplugin.models import tiny_model


@pytest.fixture
def model(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("EDGEBUILD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tiny_model(tmp_path / "tiny.onnx")


def test_an_existing_package_convert_did_not_write_is_refused(model, tmp_path):
    out = tmp_path / "Mine.mlpackage"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    done = edgebuild("convert", model, "-o", out)
    assert done.returncode == 2 and "not written by edgebuild convert" in done.stderr
    assert (out / "keep.txt").read_text() == "mine"
    assert not (tmp_path / "Mine.edgebuild.yaml").exists() and not (tmp_path / "Mine.edgebuild").exists()


def test_a_recipe_file_convert_did_not_write_is_refused(model, tmp_path):
    (tmp_path / "Net.edgebuild.yaml").write_text("edgebuild: 1\n")
    done = edgebuild("convert", model, "-o", tmp_path / "Net.mlpackage")
    assert done.returncode == 2 and "Net.edgebuild.yaml exists" in done.stderr
    assert (tmp_path / "Net.edgebuild.yaml").read_text() == "edgebuild: 1\n"


@pytest.mark.parametrize(("args", "message"), [
    (["-o", "Net.onnx"], "name it *.mlpackage"),
    (["-o", "Net.mlpackage", "--compress", "zip"], "--compress 'zip'"),
    (["-o", "Net.mlpackage", "--precision", "int3"], "use fp16 or fp32"),
])
def test_bad_options_are_usage_errors(model, tmp_path, args, message):
    done = edgebuild("convert", model, *args)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
    assert not list(tmp_path.glob("Net*"))
