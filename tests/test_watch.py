"""``edgebuild watch``: a build, then another whenever an input changes, in the same process; a
change of the installed code starts the command afresh; a recipe that fails to load is watched
for its fix."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edgebuild.build import watch as watching
from edgebuild_testplugin.models import tiny_model
from edgebuild_testplugin.recipes import RECIPE

VALIDATE = "validate: {{samples: 2, runtimes: [testcopy], thresholds: {{max_abs_max: {limit}}}}}"
WAIT = 120  # seconds: a bound for a slow machine, never a measurement


def _edit(path: Path, text: str) -> None:
    """Write ``text`` so that the file's signature surely changes (size or mtime)."""
    before = path.stat().st_mtime_ns if path.exists() else None
    path.write_text(text)
    if path.stat().st_mtime_ns == before:
        os.utime(path, ns=(before + 1_000_000, before + 1_000_000))


def _in_thread(target) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_a_changed_input_builds_again_in_the_same_process(tmp_path, monkeypatch):
    recipe, model = tmp_path / "r.yaml", tmp_path / "m.onnx"
    recipe.write_text("a")
    model.write_text("model")
    monkeypatch.setattr(watching, "code_paths", lambda: [])
    monkeypatch.setattr(watching, "input_paths", lambda recipes, builds: [recipe, model])
    built, said = [], []
    thread = _in_thread(lambda: watching.watch(lambda planned: built.append(1), [str(recipe)], say=said.append,
                                               poll=0.01, rounds=2, restart=pytest.fail))
    deadline = time.monotonic() + WAIT
    while not said and time.monotonic() < deadline:  # the first build is done and its inputs watched
        time.sleep(0.01)
    _edit(model, "a new model")
    thread.join(WAIT)
    assert not thread.is_alive() and len(built) == 2
    assert said[-1] == "changed: m.onnx"


def test_changed_code_starts_the_command_afresh(tmp_path, monkeypatch):
    plugin = tmp_path / "plugin.py"
    plugin.write_text("old")
    monkeypatch.setattr(watching, "code_paths", lambda: [plugin])
    monkeypatch.setattr(watching, "input_paths", lambda recipes, builds: [])
    restarted, said = threading.Event(), []
    thread = _in_thread(lambda: watching.watch(lambda planned: None, [], say=said.append, poll=0.01,
                                               restart=restarted.set))
    deadline = time.monotonic() + WAIT
    while not said and time.monotonic() < deadline:
        time.sleep(0.01)
    _edit(plugin, "new code")
    assert restarted.wait(WAIT)
    thread.join(WAIT)
    assert said[-1] == "installed code changed: starting afresh"


def test_a_recipe_that_failed_to_load_is_watched_for_its_fix(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("broken")
    assert watching.input_paths([str(recipe)], []) == [recipe.absolute()]


def _recipe(limit: float) -> str:
    return RECIPE.format(extra=VALIDATE.format(limit=limit))


@pytest.fixture
def project(tmp_path):
    tiny_model(tmp_path / "tiny.onnx")
    (tmp_path / "tiny.yaml").write_text(_recipe(0.01))
    return tmp_path


def _read_until(stream, needle: str, lines: list[str]) -> None:
    for line in stream:
        lines.append(line)
        if needle in line:
            return
    raise AssertionError(f"the command ended before printing {needle!r}:\n{''.join(lines)}")


def test_the_command_rebuilds_what_a_threshold_edit_reaches_and_prints_each_result(project):
    env = {**os.environ, "EDGEBUILD_CACHE_DIR": str(project / "cache")}
    process = subprocess.Popen([sys.executable, "-m", "edgebuild", "watch", "tiny.yaml"], cwd=project, env=env,
                               stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    try:
        timer = threading.Timer(WAIT, process.kill)
        timer.start()
        _read_until(process.stderr, "watching", lines)
        first = "".join(lines)
        assert "validation passed" in first and "validate  ran" in first
        _edit(project / "tiny.yaml", _recipe(0.02))
        lines.clear()
        _read_until(process.stderr, "watching", lines)
        again = "".join(lines)
        assert "changed: tiny.yaml" in again and "validation passed" in again
        # a threshold only judges: the stored measurements are judged again, nothing reruns
        assert "lower     cached" in again and "validate  cached" in again
    finally:
        timer.cancel()
        process.terminate()
        process.wait(WAIT)
