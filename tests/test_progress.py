"""Progress while stages run: sub-steps reach the display, plain lines off a terminal, -q is quiet."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from edgebuild_testplugin.cli_runner import edgebuild
from edgebuild import progress
from edgebuild.report import console
from edgebuild.dag.executor import Executor, Job
from edgebuild.stage import Result, Stage
from edgebuild.store.local import Store


def _events_of(store=None, *, steps: int = 3, scratch=None) -> list[tuple]:
    """Run one stage that reports ``steps`` sub-steps; every executor event, in order. Without a
    store the stage's output is a temporary under ``scratch``."""
    def produce(params, inputs, out):
        for done in range(1, steps + 1):
            progress.report("things done", done, steps)
        return {}

    events = []
    resolve = Stage("resolve", {}, [], resolve=lambda: Result("resolve", "k", "d", None, {}, "cached", 0.0))
    job = Job("r:v", [resolve, Stage("work", {"n": steps}, ["resolve"], produce)])
    Executor(store, on_event=lambda label, event, payload: events.append((label, event, payload)),
             scratch=scratch).run([job])
    assert job.error is None
    return events


@pytest.mark.parametrize("with_store", [False, True])
def test_a_stage_sub_steps_reach_the_display_between_start_and_done(tmp_path, with_store):
    events = _events_of(Store(tmp_path / "store")) if with_store else _events_of(scratch=tmp_path)
    work = [(event, payload) for _, event, payload in events if event.startswith("work:")]
    assert [event for event, _ in work] == ["work:start", *["work:progress"] * 4, "work:done"]
    steps = [payload for event, payload in work if event == "work:progress"]
    assert steps[0].step == progress.STARTED
    assert [(s.step, s.done, s.total) for s in steps[1:]] == [("things done", k, 3) for k in (1, 2, 3)]


def test_a_stage_served_from_the_store_reports_no_start(tmp_path):
    store = Store(tmp_path / "store")
    _events_of(store)
    again = [event for _, event, _ in _events_of(store)]
    assert "work:progress" not in again and again[-1] == "work:done"


def test_report_outside_a_build_does_nothing():
    progress.report("samples validated", 1, 2)  # no display: no error, no output


def test_live_display_shows_step_count_and_removes_finished_stages():
    from rich.console import Console

    out = io.StringIO()
    printer = console.LivePrinter(console=Console(file=out, force_terminal=True, width=120))
    printer.on_event("cnn:int4", "lower:start", None)
    printer.on_event("cnn:int4", "lower:progress", progress.Step("ops lowered", 5, 10))
    [task] = printer._live.tasks
    assert (task.fields["step"], task.completed, task.total, task.fields["count"]) == ("ops lowered", 5, 10, "5/10")
    shown = Console(file=io.StringIO(), width=120, record=True)
    shown.print(printer._live.get_renderable())
    text = shown.export_text()
    assert "cnn:int4" in text and "5/10 ops lowered" in text
    printer.on_event("cnn:int4", "lower:done", Result("lower", "k", "d", None, {}, "ran", 1.5))
    assert printer._live.tasks == [] and printer.tasks == {}
    printer.close()
    assert "lower" in out.getvalue() and "1.50s" in out.getvalue()


def test_plain_printer_writes_start_and_finish_lines_without_colour():
    out = io.StringIO()
    printer = console.Printer(out)
    printer.on_event("cnn:int4", "validate:start", None)
    printer.on_event("cnn:int4", "validate:progress", progress.Step(progress.STARTED, 0))
    printer.on_event("cnn:int4", "validate:progress", progress.Step("samples validated", 3, 8))
    printer.on_event("cnn:int4", "validate:done", Result("validate", "k", "d", None, {}, "ran", 31.25))
    assert out.getvalue().splitlines() == ["cnn:int4 validate  started", "cnn:int4 validate  ran      31.25s"]


def test_quiet_printer_keeps_errors_only():
    out = io.StringIO()
    printer = console.Printer(out, quiet=True)
    printer.on_event("r:v", "lower:progress", progress.Step(progress.STARTED, 0))
    printer.print("r:v validation passed")
    printer.error("[red]error[/] r:v: " + console.escape("shape [1, 3] does not fit [bold]"))
    assert out.getvalue() == "error r:v: shape [1, 3] does not fit [bold]\n"


def test_printer_for_picks_plain_lines_off_a_terminal_and_quiet_on_request():
    assert type(console.printer_for(io.StringIO())) is console.Printer
    assert console.printer_for(io.StringIO(), quiet=True).quiet


def test_run_off_a_terminal_prints_plain_start_and_finish_lines(project):
    recipe = project()
    done = edgebuild("run", recipe, check=0)
    lines = done.stderr.splitlines()
    for stage in ("import", "optimize", "lower", "package"):
        assert f"tiny:default {stage:<9} started" in lines
        assert any(line.startswith(f"tiny:default {stage:<9} ran") for line in lines), lines
    assert "\x1b[" not in done.stderr  # no colour, no cursor movement in a log
    # the last lines say how it went and where to look
    assert lines[-2].startswith("tiny:default built, not validated  out/default/model (")
    assert lines[-2].endswith("report: out/default/report.html")
    assert lines[-1] == "comparison of the variants: out/index.html"


def test_resolve_is_announced_when_it_hashes_a_source_and_not_when_the_digest_is_known(project):
    recipe = project()
    source = next(recipe.parent.glob("*.onnx"))
    source.write_bytes(source.read_bytes())  # new contents' stat: the digest must be read again
    first = edgebuild("run", recipe, check=0).stderr.splitlines()
    again = edgebuild("run", recipe, "--no-cache", check=0).stderr.splitlines()
    assert "tiny:default resolve   started" in first
    assert "tiny:default resolve   started" not in again
    assert any(line.startswith("tiny:default resolve ") for line in again)


def test_run_quiet_prints_nothing_on_success_and_keeps_the_json(project):
    recipe = project()
    done = edgebuild("run", recipe, "-q", "--json", check=0)
    assert done.stderr == ""
    assert json.loads(done.stdout)["variants"][0]["status"] == "built"
    again = edgebuild("run", recipe, "-q", check=0)  # a repeat answered from the stamp is as quiet
    assert again.stderr == ""


def test_run_quiet_still_shows_errors(project):
    recipe = project()
    (recipe.parent / "tiny.onnx").write_bytes(b"not onnx")
    done = edgebuild("run", recipe, "-q")
    assert done.returncode == 2 and "error" in done.stderr and "not an ONNX model" in done.stderr


def test_quiet_and_verbose_together_are_a_usage_error(project):
    done = edgebuild("run", project(), "-q", "-v", check=2)
    assert "-q and -v" in done.stderr


def test_validate_reports_each_sample(tmp_path):
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, save

    from edgebuild.dag.validate import validate
    from edgebuild.recipe.validation import ValidateSection

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), tmp_path / "m.onnx")
    seen = []
    with progress.reporting(lambda step, done, total: seen.append((step, done, total))):
        record = validate(ValidateSection(samples=3), tmp_path / "m.onnx", {}, lambda x: {"y": np.maximum(x["x"], 0)},
                          tmp_path, candidate_name="interpreter")
    assert seen == [("samples validated (interpreter)", k, 3) for k in (1, 2, 3)]
    assert record["failures"] == []


def test_a_stage_is_announced_started_once_whichever_part_says_so():
    from edgebuild import progress

    heard = []
    with progress.reporting(lambda step, done, total: heard.append(step)):
        progress.report(progress.STARTED, 0)
        progress.report("files hashed", 1, 2)
        progress.report(progress.STARTED, 0)
    assert heard == [progress.STARTED, "files hashed"]
