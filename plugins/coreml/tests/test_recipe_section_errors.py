"""Mistakes in what the Core ML plugin checks in a recipe (its compression section, compute
chips and rewrites, validation runtimes): `edgebuild validate` exits 2 with the file:line:column of the offending
value and a message that says what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgebuild_testplugin.cli_runner import assert_usage_error
from edgebuild_testplugin.models import tiny_model
from edgebuild_testplugin.recipes import BASE_RECIPE

BASE = BASE_RECIPE.replace("testcopy", "coreml")  # 7 lines: rows append from line 8

PALETTIZE = """\
edgebuild: 1
name: tiny
source: {model: m.onnx}
target: {backend: coreml, deployment_target: iOS18}
variants: {int4: {}}
compression:
  weights:
    mode: palettize
    nbits: 5
"""

# (id, recipe text, expected location, phrase of the message)
CASES = [
    ("runtime-misspelled", BASE + "validate: {runtimes: [interpeter]}\n", "recipe.yaml:8:23",
     "did you mean 'interpreter'?"),
    ("runtime-case", BASE + "validate: {runtimes: [CoreML]}\n", "recipe.yaml:8:23", "did you mean 'coreml'?"),
    ("unknown-chip", BASE + "compute: {chip: m33}\n", "recipe.yaml:8:17", "unknown chip 'm33'; did you mean 'm3'?"),
    ("unknown-rewrite", BASE + "compute: {rewrites: {split_attention: true}}\n",
     "recipe.yaml:8:", "did you mean 'split_attention_heads'?"),
    ("palettize-nbits", PALETTIZE, "recipe.yaml:9:12", "compression.weights.nbits: must be one of 1, 2, 3, 4, 6, 8"),
    ("prune-then-dtype", PALETTIZE.replace("    mode: palettize\n    nbits: 5\n",
                                           "    mode: prune\n    then: {mode: linear, dtype: int3}\n"),
     "recipe.yaml:9:33", "compression.weights.then.dtype: must be one of int8, int4, uint8, uint4"),
    ("mode-misspelled", PALETTIZE.replace("mode: palettize", "mode: palettise"), "recipe.yaml:8:11",
     "compression.weights.mode: must be one of palettize, linear, prune; did you mean 'palettize'?"),
]


def _write(root: Path, text: str) -> None:
    tiny_model(root / "m.onnx")  # x: float32 [n, 4], as the recipes say
    (root / "recipe.yaml").write_text(text)


@pytest.mark.parametrize("text, where, phrase", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_section_exits_2_with_its_location(tmp_path, monkeypatch, cli, text, where, phrase):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, text)
    code, _, err = cli("validate", "recipe.yaml")
    assert_usage_error(code, err, where, phrase)
    assert err.startswith("error: "), err


def test_rewrite_names_match_the_rewrites_the_plugin_runs():
    """compute.rewrites is checked against a list kept beside the rewrites (no coremltools import)."""
    from edgebuild_coreml.ane.rewrites import REWRITES
    from edgebuild_coreml.compute import REWRITE_NAMES

    assert set(REWRITE_NAMES) == set(REWRITES)


def test_a_tagged_union_value_is_reported_at_its_own_line_and_path(tmp_path, monkeypatch, cli):
    """The tag pydantic puts in the error's path (weights.palettize.nbits) is not the user's path."""
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, PALETTIZE)
    code, _, err = cli("validate", "recipe.yaml")
    assert code == 2
    assert err.splitlines()[0] == "error: recipe.yaml:9:12 compression.weights.nbits: must be one of 1, 2, 3, 4, 6, 8"
