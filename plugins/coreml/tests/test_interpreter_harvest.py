"""The interpreter against the expected outputs of coremltools' own op tests."""

from __future__ import annotations

import pytest

pytest.importorskip("PIL", reason="coremltools' op tests import Pillow")
pytest.importorskip("coremltools")

from edgebuild_coreml.interpreter.harvest import main, op_test_files, run_harvest, summarize  # noqa: E402


def test_summarize_counts_per_op_and_separates_non_vectors():
    records = [
        {"test": "a", "status": "matched", "ops": ["conv", "relu"], "strict": True},
        {"test": "b", "status": "mismatched", "ops": ["conv"], "strict": False, "excess": 0.3},
        {"test": "c", "status": "eval_error", "ops": ["lstm"], "error": "KeyError: 'x'"},
        {"test": "d", "status": "build_error", "error": "ValueError: bad"},
    ]
    outcomes = [{"test": t, "outcome": "passed"} for t in "abcd"] + [
        {"test": "e", "outcome": "failed_needs_torch"}
    ]
    summary = summarize(records, outcomes)
    assert summary["vectors"]["captured"] == 3
    assert summary["vectors"]["match_rate"] == pytest.approx(1 / 3, abs=1e-4)
    assert summary["per_op"]["conv"] == {"captured": 2, "matched": 1, "mismatched": 1, "strict_matched": 1}
    assert summary["not_vectors"]["build_error"] == 1
    assert summary["tests_without_vectors"] == {"passed": 1, "failed_needs_torch": 1}
    assert summary["eval_errors"] == [{"error": "KeyError: 'x'", "count": 1}]


def test_op_test_files_filters_by_family():
    files = op_test_files(["pool"])
    assert files and all("test_pool" in f for f in files)


def test_pool_vectors_match():
    summary = run_harvest(["pool"])
    vectors = summary["vectors"]
    assert vectors["captured"] >= 5, summary
    assert vectors["matched"] / vectors["captured"] >= 0.9, summary["mismatches"]
    assert {"avg_pool", "max_pool", "l2_pool"} <= set(summary["per_op"])


@pytest.mark.slow
def test_activation_and_normalization_vectors_match(tmp_path):
    import json

    out = tmp_path / "summary.json"
    assert main(["--ops", "test_activation,test_normalization", "-n", "2", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    vectors = summary["vectors"]
    assert vectors["captured"] >= 50, summary
    assert vectors["matched"] / vectors["captured"] >= 0.9, summary["mismatches"]


@pytest.mark.slow
def test_full_harvest_match_rate():
    summary = run_harvest(workers=2)
    vectors = summary["vectors"]
    assert vectors["captured"] >= 1000
    assert vectors["matched"] / vectors["captured"] >= 0.9, summary["per_op"]
