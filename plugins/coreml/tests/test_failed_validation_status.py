"""A Core ML variant whose validation misses a limit is "failed" everywhere: run --json,
report.json, report.html and the comparison page; the run exits 3 and names each failure as
an object."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

FAILURE_KEYS = {"output", "runtime", "metric", "value", "limit"}

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
        badge, verdict = ("bad", "validation failed") if record["status"] == "failed" else ("ok", "validation passed")
        assert f'<span class="badge {badge}">{verdict}</span>' in html
    index = (work / "out" / "index.html").read_text()
    assert '<span class="badge bad">validation failed</span>' in index
    assert '<span class="badge ok">validation passed</span>' in index
    assert "logits: max_abs " in index  # the missed limit, by output and metric


def test_final_lines_give_each_variant_verdict_size_and_where_to_look(built):
    _, done, _ = built
    lines = done.stderr.splitlines()
    assert lines[-1] == "comparison of the variants: out/index.html"
    ok = next(line for line in lines if line.startswith("cls:ok validation"))
    strict = next(line for line in lines if line.startswith("cls:strict validation"))
    assert "validation passed" in ok and "out/ok/model.mlpackage (" in ok and "report: out/ok/report.html" in ok
    assert "validation failed (1 limit)" in strict
    assert any(line.startswith("threshold cls:strict: interpreter: output 'logits': max_abs") for line in lines)
