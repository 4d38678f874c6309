"""The validate stage measures and its limits judge afterwards: a threshold edit flips the verdict
from the stored measurements, without running a runtime again, and says exactly what a fresh
validation under the new limits says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgebuild_testplugin.cli_runner import edgebuild
from edgebuild_testplugin.models import tiny_model
from edgebuild_testplugin.recipes import RECIPE

# compression level 2: the candidate's outputs are 1.1 times the reference's, a measurable error
EXTRA = "compression: {{level: 2}}\nvalidate: {{samples: 2, runtimes: [testcopy], thresholds: {{max_abs_max: {limit}}}}}"


@pytest.fixture
def recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EDGEBUILD_CACHE_DIR", str(tmp_path / "cache"))
    tiny_model(tmp_path / "tiny.onnx")
    return tmp_path / "tiny.yaml"


def _run(recipe: Path, limit: float, code: int) -> dict:
    recipe.write_text(RECIPE.format(extra=EXTRA.format(limit=limit)))
    done = edgebuild("run", recipe.name, "--json", check=code)
    (variant,) = json.loads(done.stdout)["variants"]
    return variant


def _statuses(variant: dict) -> dict[str, str]:
    return {stage["name"]: stage["status"] for stage in variant["stages"]}


def test_a_threshold_edit_flips_the_verdict_without_validating_again(recipe):
    passed = _run(recipe, 10.0, 0)
    assert passed["status"] == "built" and _statuses(passed)["validate"] == "ran"
    assert passed["validation"]["failures"] == []

    failed = _run(recipe, 1e-6, 3)
    assert _statuses(failed)["validate"] == "cached"  # the measurements were not taken again
    assert failed["status"] == "failed"
    assert [(f["metric"], f["limit"]) for f in failed["validation"]["failures"]] == [("max_abs", 1e-6)]
    report = json.loads(Path(failed["report_json"]).read_text())
    assert report["status"] == "failed" and report["validation"]["failures"] == failed["validation"]["failures"]
    lock = json.loads((Path(failed["output_dir"]) / "edgebuild.lock.json").read_text())
    assert lock["stages"]["validate"]["key"] == next(s["key"] for s in passed["stages"] if s["name"] == "validate")

    again = _run(recipe, 10.0, 0)
    assert _statuses(again)["validate"] == "cached" and again["status"] == "built"


def test_a_judged_record_is_what_a_fresh_validation_under_those_limits_records(recipe, tmp_path, monkeypatch):
    _run(recipe, 10.0, 0)
    judged = _run(recipe, 1e-6, 3)
    monkeypatch.setenv("EDGEBUILD_CACHE_DIR", str(tmp_path / "another-cache"))
    fresh = _run(recipe, 1e-6, 3)
    assert _statuses(fresh)["validate"] == "ran"
    assert judged["validation"] == fresh["validation"]
    assert judged["validation"]["runtimes"]["testcopy"]["limits"] == {"y": {"max_abs_max": 1e-6}}
