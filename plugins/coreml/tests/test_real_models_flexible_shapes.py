"""Shipped recipes' real models built with a dimension left flexible, validated at every shape.

Each recipe ``extends:`` the shipped one and replaces one input's shape by a range (validated at
its smallest, largest and a seeded random size) or a whole-shape enumeration (validated at each
shape). The report lists the shapes; every float output keeps cosine >= 0.9999 against
onnxruntime at each of them.

silero_vad (reflect Pad of its STFT front end, an LSTM over the frames) and ppocr_cls's width
run by default; MiniLM's sequence length and ppocr_cls's enumerated widths under ``-m slow``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_real_models import ROOT

from edgebuild.verify.shapes import range_sizes

COSINE = 0.9999


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("flexible-shapes-cache")


def _flexible(workdir, recipe: str, inputs: dict, samples: int = 2) -> None:
    """A recipe extending the shipped one with ``inputs`` in place of its source inputs."""
    shipped = ROOT / "recipes" / f"{recipe}.yaml"
    (workdir / f"{recipe}.yaml").write_text(
        f"extends: {json.dumps(str(shipped))}\n"
        f"source: {{inputs: {json.dumps(inputs)}}}\n"
        f"validate: {{samples: {samples}}}\n"
        "outputs: {dir: out}\n"
    )


def _run(recipe: str, cache, workdir) -> dict:
    """``edgebuild run --json`` on the recipe written by ``_flexible``; its report's validation record."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    done = subprocess.run(
        [sys.executable, "-m", "edgebuild.cli.app", "run", str(workdir / f"{recipe}.yaml"), "--variant", "fp32",
         "--cache-dir", str(cache), "--json"],
        capture_output=True, text=True, cwd=workdir, env=env, timeout=1800,
    )
    assert done.stdout.strip(), f"no JSON on stdout (exit {done.returncode}):\n{done.stderr[-3000:]}"
    [record] = json.loads(done.stdout)["variants"]
    assert record["status"] == "built", f"{recipe} failed: {record.get('error')}\n{done.stderr[-3000:]}"
    report = json.loads((Path(record["output_dir"]) / "report.json").read_text())
    return report["validation"]


def _check_shapes(validation: dict, expected: list[dict]) -> float:
    """The report lists exactly ``expected`` (input -> shape per set); returns the lowest cosine."""
    shapes = validation["shapes"]
    assert [entry["inputs"] for entry in shapes] == expected
    assert validation["failures"] == []
    lowest = min(c for entry in shapes for c in entry["cosine_min"]["interpreter"].values())
    assert lowest >= COSINE, json.dumps(shapes, indent=1)
    assert validation["samples"] == sum(entry["samples"] for entry in shapes)
    return lowest


def test_silero_vad_with_a_flexible_number_of_frames(cache, tmp_path):
    """The model whose reflect Pad used to stop the build; its frame count is a range."""
    _flexible(tmp_path, "silero_vad", {"input": {"shape": [{"range": [1, 64]}, 576], "dtype": "float32"},
                                       "h": {"shape": [1, 1, 128], "dtype": "float32"},
                                       "c": {"shape": [1, 1, 128], "dtype": "float32"}})
    validation = _run("silero_vad", cache, tmp_path)
    fixed = {"h": [1, 1, 128], "c": [1, 1, 128]}
    _check_shapes(validation, [{"input": [frames, 576], **fixed} for frames in range_sizes(1, 64)])


def test_ppocr_cls_with_a_flexible_width(cache, tmp_path):
    _flexible(tmp_path, "ppocr_cls", {"x": {"shape": [1, 3, 48, {"range": [48, 640]}], "dtype": "float32"}})
    validation = _run("ppocr_cls", cache, tmp_path)
    _check_shapes(validation, [{"x": [1, 3, 48, width]} for width in range_sizes(48, 640)])


@pytest.mark.slow
def test_ppocr_cls_with_enumerated_shapes(cache, tmp_path):
    shapes = [[1, 3, 48, 96], [1, 3, 48, 192], [1, 3, 48, 320]]
    _flexible(tmp_path, "ppocr_cls", {"x": {"shape": {"enumerated": shapes}, "dtype": "float32"}})
    validation = _run("ppocr_cls", cache, tmp_path)
    _check_shapes(validation, [{"x": shape} for shape in shapes])


@pytest.mark.slow
def test_minilm_with_a_flexible_sequence_length(cache, tmp_path):
    """input_ids and attention_mask share the range, so every set gives them the same length."""
    flexible = {"shape": [1, {"range": [1, 256]}], "dtype": "int64"}
    _flexible(tmp_path, "minilm_paraphrase", {"input_ids": flexible, "attention_mask": flexible})
    validation = _run("minilm_paraphrase", cache, tmp_path)
    _check_shapes(validation, [{"input_ids": [1, n], "attention_mask": [1, n]} for n in range_sizes(1, 256)])
