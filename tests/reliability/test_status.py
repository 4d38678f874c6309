"""A variant whose validation misses a limit is "failed", with each failure an object: the run's
own bookkeeping, without a backend (end to end through run --json, report.json, report.html and
the comparison page: the Core ML plugin's tests)."""

from __future__ import annotations

from pathlib import Path

from edgebuild.dag.executor import Job
from edgebuild.dag.stages import Result

FAILURE_KEYS = {"output", "runtime", "metric", "value", "limit"}


class _Variant:
    name = "int4"

    class recipe:  # noqa: N801 - the attributes run.py reads
        name = "cnn"


def _build(tmp_path: Path, runtimes: dict, error=None):
    from edgebuild.build.jobs import Build

    validate = Result("validate", "k" * 64, "d", tmp_path, {"samples": 4, "runtimes": runtimes, "failures": []}, "ran", 1.0)
    job = Job("cnn:int4", [], {"validate": validate}, error)
    return Build(_Variant(), job, tmp_path / "int4", "model.bin")


def test_a_failed_limit_makes_the_variant_failed_with_structured_failures(tmp_path):
    from edgebuild.build.run import _status, _variant_json

    failure = {"output": "logits", "metric": "cosine", "value": 0.99, "limit": 0.999, "statistic": "worst",
               "message": "output 'logits': cosine 0.99 < cosine_min 0.999"}
    build = _build(tmp_path, {"interpreter": {"metrics": {}, "failures": [failure]}, "coreml": {"skipped": "not macOS"}})
    assert _status(build) == "failed"
    record = _variant_json(build)
    assert record["status"] == "failed"
    [got] = record["validation"]["failures"]
    assert FAILURE_KEYS <= set(got) and got["runtime"] == "interpreter" and got["value"] == 0.99


def test_failures_are_read_from_the_runtimes_even_when_a_cached_stage_kept_sentences(tmp_path):
    from edgebuild.build.run import _variant_json

    build = _build(tmp_path, {"interpreter": {"metrics": {}, "failures": [
        {"output": "y", "metric": "max_abs", "value": 0.5, "limit": 0.1, "message": "..."}]}})
    build.job.results["validate"].info["failures"] = ["interpreter: output 'y': max_abs 0.5 > max_abs_max 0.1"]
    assert _variant_json(build)["validation"]["failures"][0]["metric"] == "max_abs"


def test_a_variant_within_its_limits_is_built(tmp_path):
    from edgebuild.build.run import _status

    assert _status(_build(tmp_path, {"interpreter": {"metrics": {}, "failures": []}})) == "built"
