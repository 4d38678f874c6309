"""A variant whose validation misses a limit is "failed" everywhere: run --json, report.json,
report.html and the comparison page; the run exits 3 and names each failure as an object."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgebuild.dag.executor import Job
from edgebuild.dag.stages import Result

FAILURE_KEYS = {"output", "runtime", "metric", "value", "limit"}


# -- the run's own bookkeeping, without a backend ------------------------------------------------

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


# -- end to end through the Core ML backend --------------------------------------------------------

RECIPE = """\
edgebuild: 1
name: cls
source: {model: cls.onnx, inputs: {x: {shape: [1, 8]}}}
target: {backend: coreml, precision: float32}
validate:
  samples: 3
  runtimes: [interpreter]
  thresholds: {cosine_min: 0.999, top1_agreement_min: 0.9}
variants:
  ok: {}
  strict: {target: {precision: float16}, validate: {thresholds: {max_abs_max: 1.0e-9}}}  # fp16 rounding misses it
outputs: {dir: out}
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    pytest.importorskip("edgebuild_coreml")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    work = tmp_path_factory.mktemp("status")
    w = numpy_helper.from_array(np.linspace(-1, 1, 24, dtype=np.float32).reshape(8, 3), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["logits"])], "cls",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 3])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), work / "cls.onnx")
    (work / "cls.yaml").write_text(RECIPE)
    done = subprocess.run([sys.executable, "-m", "edgebuild.cli.app", "run", "cls.yaml", "--json"], cwd=work,
                          capture_output=True, text=True, env={**os.environ, "EDGEBUILD_CACHE_DIR": str(work / "cache")})
    variants = {v["variant"]: v for v in json.loads(done.stdout)["variants"]} if done.stdout else {}
    return work, done, variants


def test_run_exits_3_and_json_says_failed_with_failure_objects(built):
    work, done, variants = built
    assert done.returncode == 3, done.stderr
    assert json.loads(done.stdout)["version"]
    assert variants["ok"]["status"] == "built" and variants["ok"]["validation"]["failures"] == []
    strict = variants["strict"]
    assert strict["status"] == "failed"
    [failure] = strict["validation"]["failures"]
    assert FAILURE_KEYS <= set(failure)
    assert (failure["output"], failure["runtime"], failure["metric"], failure["limit"]) == ("logits", "interpreter", "max_abs", 1e-9)
    assert isinstance(failure["value"], float) and failure["value"] > 1e-9


def test_run_json_carries_report_paths_and_artifact_sizes(built):
    work, _, variants = built
    for record in variants.values():
        [artifact] = record["artifacts"]  # validation failing does not hide what was built
        size = sum(f.stat().st_size for f in Path(artifact).rglob("*") if f.is_file())
        assert record["artifact_sizes"] == {artifact: size} and size > 0
        assert Path(record["report"]).name == "report.html" and Path(record["report"]).is_file()
        assert Path(record["report_json"]).is_file()
        assert Path(record["comparison"]) == work / "out" / "index.html"


def test_report_json_and_html_agree_with_the_run(built):
    work, _, variants = built
    for name, record in variants.items():
        report = json.loads((work / "out" / name / "report.json").read_text())
        html = (work / "out" / name / "report.html").read_text()
        assert report["status"] == record["status"]
        assert report["validation"]["failures"] == record["validation"]["failures"]
        badge = "bad" if record["status"] == "failed" else "ok"
        assert f'<span class="badge {badge}">{record["status"]}</span>' in html
    index = (work / "out" / "index.html").read_text()
    assert '<span class="badge bad">failed</span>' in index and '<span class="badge ok">built</span>' in index


def test_final_lines_give_each_variant_verdict_size_and_where_to_look(built):
    _, done, _ = built
    lines = done.stderr.splitlines()
    assert lines[-1] == "comparison of the variants: out/index.html"
    ok = next(line for line in lines if line.startswith("cls:ok validation"))
    strict = next(line for line in lines if line.startswith("cls:strict validation"))
    assert "validation passed" in ok and "out/ok/model.mlpackage (" in ok and "report: out/ok/report.html" in ok
    assert "validation failed (1 limit)" in strict
    assert any(line.startswith("threshold cls:strict: interpreter: output 'logits': max_abs") for line in lines)
