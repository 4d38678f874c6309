"""recipes/tiny_llama.yaml runs as shipped: its script remakes the committed checkpoint byte for
byte (no download), and ``edgebuild run`` builds both variants and validates them by generation
against the eager model."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("edgebuild_coreml")

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow  # exports, lowers and validates two variants: about a minute on 2 cores
def test_the_shipped_llm_recipe_builds_generates_and_validates(tmp_path):
    clone = tmp_path / "clone"
    (clone / "recipes" / "models").mkdir(parents=True)
    for name in ("recipes/tiny_llama.yaml", "recipes/models/make_tiny_llama.py"):
        shutil.copy(ROOT / name, clone / name)
    subprocess.run([sys.executable, "recipes/models/make_tiny_llama.py"], cwd=clone, check=True,
                   capture_output=True)
    made, committed = clone / "recipes" / "models" / "tiny_llama", ROOT / "recipes" / "models" / "tiny_llama"
    for name in ("config.json", "model.safetensors"):
        assert (made / name).read_bytes() == (committed / name).read_bytes(), f"{name} differs from the committed one"
    done = subprocess.run([sys.executable, "-m", "edgebuild.cli.app", "run", "recipes/tiny_llama.yaml", "--json",
                           "--cache-dir", str(tmp_path / "store")], cwd=clone, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not [line for line in done.stderr.splitlines() if line.startswith("warning")]  # edgebuild's own
    result = json.loads(done.stdout)
    assert {v["variant"] for v in result["variants"]} == {"fp16", "int8"}
    for variant in result["variants"]:
        assert variant["status"] == "built" and variant["validation"]["failures"] == []
        [generation] = [r["generation"] for r in variant["validation"]["runtimes"].values() if "generation" in r]
        assert generation["mean_agreement"] >= 0.9 and generation["new_tokens"] == 12
        assert (clone / "build" / "tiny-llama" / variant["variant"] / "model.mlpackage").is_dir()
