"""report.json / report.html for a variant, and the page comparing variants."""

import json
import re
import shutil
import subprocess
from html import escape
from pathlib import Path

import numpy as np
import pytest

from edgebuild.verify.metrics import aggregate, compare, error_histogram, merge_histograms
from edgebuild.verify.report import runtime_record, write_combined, write_report
from edgebuild.verify.thresholds import check, limits_for

CHROMIUM = Path("/usr/bin/chromium")


def variant_data(variant: str, noise: float, shrink: int, *, layer_name: str = "conv1.weight") -> dict:
    rng = np.random.default_rng(0)
    samples, histograms = [], []
    for _ in range(3):
        ref = {"logits": rng.normal(size=(1, 100)), "features": rng.normal(size=(1, 8, 4))}
        cand = {k: v + noise * rng.normal(size=v.shape) for k, v in ref.items()}
        samples.append(compare(ref, cand))
        histograms.append(error_histogram(ref, cand))
    aggregated = aggregate(samples)
    thresholds = {"cosine_min": 0.999, "max_abs_max": 0.05}
    failures = check(aggregated, thresholds)
    layers = [{"name": layer_name, "before_bytes": 4000, "after_bytes": 4000 // shrink},
              {"name": "fc.weight", "before_bytes": 8000, "after_bytes": 8000 // shrink}]
    return {
        "recipe": "demo", "variant": variant, "status": "failed" if failures else "passed",
        "artifact": {"path": "model.mlpackage", "size_bytes": 12000 // shrink},
        "stages": [{"name": "import", "key": "0" * 64, "status": "cached", "seconds": 0.01},
                   {"name": "lower", "key": "1" * 64, "status": "ran", "seconds": 1.25}],
        "sizes": {"layers": layers},
        "validation": {"samples": 3, "reference": "onnxruntime", "runtimes": {
            "interpreter": runtime_record(aggregated, failures, limits={o: limits_for(thresholds, {}, o) for o in aggregated},
                                          histograms=merge_histograms(histograms)),
            "coreml": {"skipped": "Core ML runs only on macOS"}}},
        "plan": {"ops": [{"name": "conv_0", "op_type": "conv", "unit": "ane", "ms": 0.5}],
                 "breakdown": {"ane": 0.5}, "total_ms": 0.5},
        "optimize": {"rules": {"conv_bn_fold": 2}},
        "notes": ["interpreter run with fp16 emulation"],
    }


def external_refs(html: str) -> list[str]:
    return [value for value in re.findall(r'(?:src|href)\s*=\s*["\']?([^"\' >]*)', html, flags=re.I) if "http" in value.lower() or value.startswith("//")]


def test_writes_json_and_self_contained_html(tmp_path):
    data = variant_data("int8", noise=0.1, shrink=4)
    json_path, html_path = write_report(tmp_path / "int8", data)
    assert json_path == tmp_path / "int8" / "report.json" and html_path == tmp_path / "int8" / "report.html"
    saved = json.loads(json_path.read_text())
    assert saved["variant"] == "int8"
    interp = saved["validation"]["runtimes"]["interpreter"]
    assert interp["metrics"]["logits"]["cosine"]["min"] == pytest.approx(data["validation"]["runtimes"]["interpreter"]["metrics"]["logits"]["cosine"]["min"])
    assert interp["failures"] and {"output", "metric", "value", "limit", "message"} <= set(interp["failures"][0])

    html = html_path.read_text()
    assert html.count("<svg") >= 3  # sizes chart + one histogram per output
    assert external_refs(html) == [] and "<script" not in html and "<link" not in html
    for text in ("Stages", "Weights per layer", "Numerics", "Compute plan", "Fusion rules fired", "conv_bn_fold",
                 "interpreter run with fp16 emulation", "Core ML runs only on macOS", "FAIL"):
        assert text in html
    assert escape(interp["failures"][0]["message"]) in html


def test_nonfinite_values_written_as_strings(tmp_path):
    data = {"validation": {"runtimes": {"interpreter": {"metrics": {"y": {"snr_db": {"avg": 1.0, "p90": 1.0, "p99": 1.0, "max": float("inf"), "min": float("nan")}}}}}}}
    json_path, html_path = write_report(tmp_path, data)
    stats = json.loads(json_path.read_text())["validation"]["runtimes"]["interpreter"]["metrics"]["y"]["snr_db"]
    assert stats["max"] == "inf" and stats["min"] == "nan"
    assert ">inf<" in html_path.read_text()


def test_names_are_escaped(tmp_path):
    data = variant_data("fp16", noise=1e-4, shrink=2, layer_name="<script>alert(1)</script>")
    _, html_path = write_report(tmp_path, data)
    html = html_path.read_text()
    assert "<script>" not in html and "&lt;script&gt;" in html


@pytest.mark.parametrize("data", [{}, {"recipe": "r"}, {"validation": {}, "plan": {}, "optimize": {"rules": []}, "sizes": {}},
                                  {"optimize": {"rules": ["a", "b"]}, "notes": "one note", "plan": {"breakdown": {"ane": {"ms": 1, "ops": 2}}}}])
def test_missing_sections_still_render(tmp_path, data):
    json_path, html_path = write_report(tmp_path, data)
    assert json.loads(json_path.read_text()) == data
    assert html_path.read_text().startswith("<!doctype html>")


def test_combined_page(tmp_path):
    for variant, noise, shrink in (("fp16", 1e-4, 2), ("int8", 1e-2, 4), ("int4", 0.2, 8)):
        write_report(tmp_path / variant, variant_data(variant, noise, shrink))
    (tmp_path / "notes").mkdir()  # a folder without a report is ignored
    index = write_combined(tmp_path)
    assert index == tmp_path / "index.html"
    html = index.read_text()
    assert html.count("<circle") == 3 and "<svg" in html
    for variant in ("fp16", "int8", "int4"):
        assert f'href="{variant}/report.html"' in html
    assert external_refs(html) == []
    assert html.index(">fp16<") < html.index(">int4<") < html.index(">int8<")  # sorted by folder


def test_combined_page_with_no_reports(tmp_path):
    html = write_combined(tmp_path).read_text()
    assert "0 variant(s)" in html


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium not installed (apt-get install -y chromium)")
def test_report_renders_in_headless_chromium(tmp_path):
    for variant, noise, shrink in (("fp16", 1e-4, 2), ("int4", 0.2, 8)):
        write_report(tmp_path / variant, variant_data(variant, noise, shrink))
    write_combined(tmp_path)
    for page in ("int4/report.html", "index.html"):
        png = tmp_path / (page.replace("/", "_") + ".png")
        subprocess.run(
            [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
             f"--screenshot={png}", "--window-size=1200,2000", (tmp_path / page).as_uri()],
            check=True, capture_output=True, timeout=120,
        )
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert len(data) > 20_000  # a blank page compresses to a few KB


def test_failed_limit_shown_even_without_limits(tmp_path):
    ref = {"y": np.arange(10.0)}
    aggregated = aggregate([compare(ref, {"y": ref["y"] + 0.5})])
    failures = check(aggregated, {"max_abs_max": 0.1})
    _, html_path = write_report(tmp_path, {"validation": {"runtimes": {"interpreter": runtime_record(aggregated, failures)}}})
    html = html_path.read_text()
    assert "≤ 0.1" in html and ">FAIL<" in html
