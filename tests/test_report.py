"""report.json / report.html for a variant, and the page comparing variants."""

import json
import os
import re
import shutil
import subprocess
from html import escape
from pathlib import Path

import numpy as np
import pytest

from edgebuild_testplugin.cli_runner import edgebuild
from edgebuild.errors import BuildError, UsageError
from edgebuild.verify.metrics import aggregate, compare, error_histogram, merge_histograms
from edgebuild.report.write import runtime_record, write_combined, write_report
from edgebuild.verify.thresholds import aggregation_for, check, limits_for

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
    weights = [{"name": layer_name, "op_type": "conv", "shape": [4, 1000], "bytes_before": 4000,
                "bytes_after": 4000 // shrink, "mode": "palettize"},
               {"name": "fc.weight", "op_type": "linear", "shape": [8, 1000], "bytes_before": 8000,
                "bytes_after": 8000 // shrink, "mode": "palettize"}]
    stages = [{"name": "import", "key": "0" * 64, "status": "cached", "seconds": 0.01},
              {"name": "lower", "key": "1" * 64, "status": "ran", "seconds": 1.25},
              {"name": "compress", "key": "2" * 64, "status": "ran", "seconds": 0.5}]
    compression = {"weights": weights, "bytes_before": 12000, "bytes_after": 12000 // shrink}
    return {
        "recipe": "demo", "variant": variant, "status": "failed" if failures else "built",
        "edgebuild_version": "0.1.0", "recipe_path": "../../demo.yaml",
        "source": {"model": "demo.onnx", "sha256": "ab" * 32},
        "target": {"backend": "coreml", "deployment_target": "iOS17", "precision": "float16"},
        "compute": {"policy": "cpu_and_ne", "chip": "m3"},
        "versions": {"edgebuild": "0.1.0", "edgebuild-coreml": "0.1.0"},
        "artifact": {"path": "model.mlpackage", "kind": "mlpackage", "size_bytes": 12000 // shrink},
        "comparison": "../index.html",
        "stages": stages,
        "compress": compression, "compression": compression,
        "validation": {"samples": 3, "reference": "onnxruntime", "runtimes": {
            "interpreter": runtime_record(aggregated, failures, limits={o: limits_for(thresholds, {}, o) for o in aggregated},
                                          aggregation={o: aggregation_for(thresholds, {}, o) for o in aggregated},
                                          histograms=merge_histograms(histograms)),
            "coreml": {"skipped": "Core ML runs only on macOS"}}},
        "plan": {"ops": [{"name": "conv_0", "op": "conv", "unit": "ane", "est_ms": 0.5, "reasons": []},
                         {"name": "gelu_0", "op": "gelu", "unit": "cpu", "est_ms": 0.25,
                          "reasons": [{"message": "gelu 'gelu_0' has no ANE kernel", "fix": "use an approximation"}]},
                         {"name": "gelu_1", "op": "gelu", "unit": "cpu", "est_ms": 0.25,
                          "reasons": [{"message": "gelu 'gelu_1' has no ANE kernel", "fix": "use an approximation"}]}],
                 "breakdown": {"ane": 50.0, "gpu": 0.0, "cpu": 50.0}, "total_ms": 1.0},
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
    assert html.count("<svg") >= 4  # overall and per-weight size charts + one histogram per output
    assert external_refs(html) == [] and "<script" not in html and "<link" not in html
    for text in ("Stages", "Compression", "Numerics", "Compute plan", "Fusion rules fired", "conv_bn_fold",
                 "interpreter run with fp16 emulation", "Core ML runs only on macOS", "FAIL"):
        assert text in html
    assert escape(interp["failures"][0]["message"]) in html


def test_compression_section_draws_every_weight_and_the_overall_ratio(tmp_path):
    _, html_path = write_report(tmp_path, variant_data("int4", noise=1e-4, shrink=4))
    html = html_path.read_text()
    section = html[html.index('<section id="compression">'):html.index("</section>")]
    assert section.count("<svg") == 2 and "conv1.weight" in section and "fc.weight" in section
    assert "4.00× smaller" in section and "12.00 KB before, 3.00 KB after" in section
    assert ">4.00× smaller than before compression<" in html  # the summary card, with no source weights counted


def test_a_compression_record_the_page_cannot_read_fails_the_build(tmp_path):
    data = variant_data("int4", noise=1e-4, shrink=4)
    data["compression"] = {"weights": [{"name": "w", "before_bytes": 10, "after_bytes": 5}]}
    with pytest.raises(BuildError, match="bytes_before"):
        write_report(tmp_path, data)
    assert not (tmp_path / "report.json").exists()


def test_an_unknown_section_is_an_error_not_silently_dropped(tmp_path):
    data = variant_data("int4", noise=1e-4, shrink=4)
    data["sizes"] = {"layers": []}
    with pytest.raises(BuildError, match="sizes"):
        write_report(tmp_path, data)


def test_header_names_recipe_source_target_policy_versions_and_links_the_comparison(tmp_path):
    html = write_report(tmp_path, variant_data("fp16", noise=1e-4, shrink=2))[1].read_text()
    for text in ("../../demo.yaml", "ab" * 32, "coreml · iOS17", "float16", "cpu_and_ne (planned for m3)",
                 "edgebuild 0.1.0, edgebuild-coreml 0.1.0", 'href="../index.html"'):
        assert text in html, text


def test_status_is_coloured_by_truth(tmp_path):
    failed = write_report(tmp_path / "a", variant_data("int4", noise=0.2, shrink=8))[1].read_text()
    passed = write_report(tmp_path / "b", variant_data("fp16", noise=1e-6, shrink=2))[1].read_text()
    assert '<span class="badge bad">validation failed</span>' in failed
    assert '<span class="badge ok">validation passed</span>' in passed and "badge bad" not in passed


def test_cosine_shows_as_one_minus_cosine_with_enough_digits(tmp_path):
    ref = {"y": np.linspace(-1, 1, 1000)}
    aggregated = aggregate([compare(ref, {"y": ref["y"] * (1 + 1e-3 * np.sin(np.arange(1000)))})])
    cosine = aggregated["y"]["cosine"]["min"]
    assert f"{cosine:.4g}" == "1"  # what the page used to show
    record = runtime_record(aggregated, check(aggregated, {"cosine_min": 0.99999}), limits={"y": {"cosine_min": 0.99999}})
    html = write_report(tmp_path, {"validation": {"runtimes": {"interpreter": record}}})[1].read_text()
    assert f"{1 - cosine:.3e}" in html and "≤ 1.000e-05" in html


def test_nonfinite_values_written_as_strings(tmp_path):
    data = {"validation": {"runtimes": {"interpreter": {"metrics": {"y": {"snr_db": {"avg": 1.0, "p90": 1.0, "p99": 1.0, "max": float("inf"), "min": float("nan")}}}}}}}
    json_path, html_path = write_report(tmp_path, data)
    stats = json.loads(json_path.read_text())["validation"]["runtimes"]["interpreter"]["metrics"]["y"]["snr_db"]
    assert stats["max"] == "inf" and stats["min"] == "nan"
    assert ">nan<" in html_path.read_text()  # the worst (lowest) SNR


def test_names_are_escaped(tmp_path):
    data = variant_data("fp16", noise=1e-4, shrink=2, layer_name="<script>alert(1)</script>")
    _, html_path = write_report(tmp_path, data)
    html = html_path.read_text()
    assert "<script>" not in html and "&lt;script&gt;" in html


@pytest.mark.parametrize("data", [{}, {"recipe": "r"}, {"validation": {}, "plan": {}, "optimize": {"rules": []}},
                                  {"optimize": {"rules": ["a", "b"]}, "notes": ["one note"], "plan": {"breakdown": {"ane": {"ms": 1, "ops": 2}}}}])
def test_missing_sections_still_render(tmp_path, data):
    json_path, html_path = write_report(tmp_path, data)
    assert json.loads(json_path.read_text()) == data
    assert html_path.read_text().startswith("<!doctype html>")


def test_plan_section_groups_ops_by_reason(tmp_path):
    html = write_report(tmp_path, variant_data("fp16", noise=1e-4, shrink=2))[1].read_text()
    plan = html[html.index("Compute plan"):]
    assert plan.count("has no ANE kernel") == 1 and "gelu_0" not in plan
    assert "<td>gelu</td><td>2</td>" in plan.replace('<td class="num">', "<td>")


def test_combined_page(tmp_path):
    for variant, noise, shrink in (("fp16", 1e-4, 2), ("int8", 1e-2, 4), ("int4", 0.2, 8)):
        write_report(tmp_path / variant, variant_data(variant, noise, shrink))
    (tmp_path / "notes").mkdir()  # a folder without a report is ignored
    index = write_combined(tmp_path)
    assert index == tmp_path / "index.html"
    html = index.read_text()
    assert html.count("<circle") == 3 and "<svg" in html
    for variant in ("fp16", "int8", "int4"):
        assert f'href="./{variant}/report.html"' in html
    assert external_refs(html) == []
    assert html.index(">fp16<") < html.index(">int4<") < html.index(">int8<")  # sorted by folder


def test_combined_page_with_no_reports_is_an_error(tmp_path):
    with pytest.raises(UsageError, match="no variant reports"):
        write_combined(tmp_path)
    assert not (tmp_path / "index.html").exists()


def test_report_command_finds_every_variant_below_a_parent_folder(tmp_path):
    for recipe in ("det", "cls"):
        for variant, noise, shrink in (("fp16", 1e-4, 2), ("int4", 0.2, 8)):
            data = variant_data(variant, noise, shrink)
            write_report(tmp_path / "build" / recipe / variant, {**data, "recipe": recipe})
    (tmp_path / "build" / "det" / ".int4.x.tmp").mkdir()  # a build's temporary: ignored
    write_report(tmp_path / "build" / "det" / ".int4.x.tmp", variant_data("int4", 0.2, 8))
    done = edgebuild("report", tmp_path / "build", check=0)
    html = (tmp_path / "build" / "index.html").read_text()
    assert Path(done.stdout.strip()) == tmp_path / "build" / "index.html" and "4 variant(s)" in done.stderr
    for link in ("det/fp16/report.html", "det/int4/report.html", "cls/fp16/report.html", "cls/int4/report.html"):
        assert f'href="./{link}"' in html
    assert ".tmp" not in html and ">det / int4<" in html


def test_report_command_on_a_folder_without_reports_exits_2(tmp_path):
    done = edgebuild("report", tmp_path, check=2)
    assert "no variant reports" in done.stderr and not (tmp_path / "index.html").exists()


ARTIFACTS = Path(os.environ.get("EDGEBUILD_TEST_ARTIFACTS", "")) if os.environ.get("EDGEBUILD_TEST_ARTIFACTS") else None
FAIL_BG, PASS_BG, BEFORE = (0xFD, 0xEC, 0xEA), (0xE6, 0xF4, 0xEA), (0x9A, 0xA5, 0xB8)  # html.CSS --fail-bg, --pass-bg, --before


def screenshot(page: Path, png: Path, profile: Path) -> dict[tuple[int, int, int], int]:
    """Render ``page`` in headless Chromium into ``png``; pixel counts of its colours."""
    subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
         f"--screenshot={png}", "--window-size=1200,1800", "--hide-scrollbars", page.as_uri()],
        check=True, capture_output=True, timeout=120,
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if ARTIFACTS is not None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy2(png, ARTIFACTS / png.name)
    image = pytest.importorskip("PIL.Image").open(png).convert("RGB")
    return {colour: count for count, colour in image.getcolors(maxcolors=1 << 20)}


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium not installed (apt-get install -y chromium)")
def test_report_renders_in_headless_chromium(tmp_path):
    """The pages as a browser draws them (screenshots kept in $EDGEBUILD_TEST_ARTIFACTS when set):
    the compression chart's bars are drawn, and the status badge is red exactly when it failed."""
    for variant, noise, shrink in (("fp16", 1e-6, 2), ("int4", 0.2, 8)):
        write_report(tmp_path / variant, variant_data(variant, noise, shrink))
    write_combined(tmp_path)
    failed = screenshot(tmp_path / "int4" / "report.html", tmp_path / "report-int4-failed.png", tmp_path / "profile")
    passed = screenshot(tmp_path / "fp16" / "report.html", tmp_path / "report-fp16-built.png", tmp_path / "profile")
    screenshot(tmp_path / "index.html", tmp_path / "report-index.png", tmp_path / "profile")
    assert failed.get(FAIL_BG, 0) > 200 and failed.get(BEFORE, 0) > 500
    assert passed.get(FAIL_BG, 0) == 0 and passed.get(PASS_BG, 0) > 200 and passed.get(BEFORE, 0) > 500


def test_failed_limit_shown_even_without_limits(tmp_path):
    ref = {"y": np.arange(10.0)}
    aggregated = aggregate([compare(ref, {"y": ref["y"] + 0.5})])
    failures = check(aggregated, {"max_abs_max": 0.1})
    _, html_path = write_report(tmp_path, {"validation": {"runtimes": {"interpreter": runtime_record(aggregated, failures)}}})
    html = html_path.read_text()
    assert "≤ 0.1" in html and ">FAIL<" in html


def test_an_unreadable_report_is_left_off_the_page_when_asked(tmp_path):
    write_report(tmp_path / "fp16", variant_data("fp16", 1e-4, 2))
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "report.json").write_text(json.dumps({"status": "passed", "sizes": {"layers": []}}))
    with pytest.raises(BuildError, match="old/report.json"):
        write_combined(tmp_path)
    skipped = []
    html = write_combined(tmp_path, on_skip=lambda path, why: skipped.append((path, why))).read_text()
    assert [path for path, _ in skipped] == [tmp_path / "old" / "report.json"] and "report schema" in skipped[0][1]
    assert 'href="./fp16/report.html"' in html and "old/" not in html
