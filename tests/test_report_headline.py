"""The report and the console tell it straight: the headline is the validation verdict, the
variants page names what failed, the fusion table shows what fired, and a stage's warning is
printed once, when the stage runs, and kept in the report."""

from __future__ import annotations

import functools

import re

import pytest

from edgebuild.report.write import write_combined, write_report

from test_report import variant_data


def _heading(html: str) -> str:
    return re.search(r"<h1>(.*?)</h1>", html).group(1)


def test_the_headline_is_the_validation_verdict(tmp_path):
    failed = write_report(tmp_path / "a", variant_data("int4", noise=0.2, shrink=8))[1].read_text()
    passed = write_report(tmp_path / "b", variant_data("fp16", noise=1e-6, shrink=2))[1].read_text()
    assert '<span class="badge bad">validation failed</span>' in _heading(failed)
    assert '<span class="badge ok">validation passed</span>' in _heading(passed)
    assert ">built<" not in failed + passed


def test_a_report_whose_every_runtime_was_skipped_is_not_called_validated(tmp_path):
    data = variant_data("fp16", noise=1e-6, shrink=2)
    data["validation"]["runtimes"] = {"coreml": {"skipped": "Core ML runs only on macOS"}}
    html = write_report(tmp_path, data)[1].read_text()
    assert '<span class="badge neutral">built, not validated</span>' in _heading(html)
    assert "validation passed" not in html


def test_a_build_without_validation_says_so_on_the_console_and_the_page(project, cli):
    recipe = project()
    code, _, err = cli("run", recipe)
    assert code == 0, err
    line = err.splitlines()[-2]
    assert line.startswith("tiny:default built, not validated  out/default/model (") and "validation passed" not in err
    html = (recipe.parent / "out" / "default" / "report.html").read_text()
    assert '<span class="badge neutral">built, not validated</span>' in _heading(html)


def test_the_variants_page_names_each_failed_limit_by_output_and_metric(tmp_path):
    data = variant_data("int4", noise=0.2, shrink=8)
    write_report(tmp_path / "int4", data)
    write_report(tmp_path / "fp16", variant_data("fp16", noise=1e-6, shrink=2))
    html = write_combined(tmp_path).read_text()
    row = html[html.index('int4/report.html"'):]
    row = row[:row.index("</tr>")]
    failures = data["validation"]["runtimes"]["interpreter"]["failures"]
    assert failures
    for failure in failures[:3]:
        metric = f"1 − {failure['metric']}" if failure["metric"] == "cosine" else failure["metric"]
        assert f"{failure['output']}: {metric} " in row and "(limit " in row, row
    assert "interpreter" in row and '<span class="badge bad">validation failed</span>' in row
    passed = html[html.index('fp16/report.html"'):]
    assert passed[:passed.index("</tr>")].endswith("<td>none</td>")


def test_the_fusion_table_shows_what_fired_and_folds_the_rest(tmp_path):
    data = variant_data("fp16", noise=1e-6, shrink=2)
    data["optimize"] = {"rules": {"fuse_bias": 6, "fuse_conv_bn": 0, "fuse_attention": 0, "fuse_gated_mlp": 0}}
    html = write_report(tmp_path / "a", data)[1].read_text()
    section = html[html.index("<h2>Fusion rules fired</h2>"):]
    table = section[:section.index("</table>")]
    assert "<td>fuse_bias</td><td>6</td>" in table and "fuse_conv_bn" not in table
    assert "<details><summary>3 rules did not match</summary>" in section
    assert "fuse_conv_bn, fuse_attention, fuse_gated_mlp" in section

    data["optimize"] = {"rules": {"fuse_conv_bn": 0}}
    html = write_report(tmp_path / "b", data)[1].read_text()
    assert "No fusion rule matched this model." in html and "<summary>1 rule did not match</summary>" in html


WARNING = "the plan puts nothing where the policy asked"


@pytest.fixture
def warning_backend(monkeypatch):
    """The test backend with a lower stage that warns, as a real backend's compute plan may."""
    from edgebuild_testplugin import CopyBackend

    stages = CopyBackend.stages

    def warning_stages(self, variant, registry):
        made = stages(self, variant, registry)
        lower = next(s for s in made if s.name == "lower")
        lower.body = functools.partial(_warning_after, lower.body)
        return made

    monkeypatch.setattr(CopyBackend, "stages", warning_stages)


def test_a_warning_is_printed_when_its_stage_runs_not_on_cached_runs(project, cli, warning_backend):
    recipe = project()
    code, _, first = cli("run", recipe)
    assert code == 0, first
    assert first.count(WARNING) == 1 and "see the report" not in first
    report = (recipe.parent / "out" / "default" / "report.html").read_text()
    assert '<section id="warnings">' in report and WARNING in report

    # every stage cached (the outputs are written again): counted, not repeated
    (recipe.parent / "out" / "default" / "report.html").unlink()
    code, _, cached = cli("run", recipe)
    assert code == 0 and "lower     cached" in cached, cached
    assert WARNING not in cached
    assert cached.count("1 warning, see the report") == 1
    assert WARNING in (recipe.parent / "out" / "default" / "report.html").read_text()

    # an identical repeat, answered without the executor: the same
    code, _, repeat = cli("run", recipe)
    assert code == 0 and WARNING not in repeat and repeat.count("1 warning, see the report") == 1, repeat

    # --force runs the stage again: its warning is news again
    code, _, forced = cli("run", recipe, "--force")
    assert code == 0 and forced.count(WARNING) == 1 and "see the report" not in forced


def _warning_after(body, params, inputs, out):
    """``body``'s info with the lower stage's warning added."""
    return {**body(params, inputs, out), "warnings": [WARNING]}
