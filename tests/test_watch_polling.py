"""``edgebuild watch`` polls its few inputs often and the installed code (hundreds of files) seldom,
and never rebuilds on code that changed since the last build, however seldom the code is polled."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from edgebuild.build import watch as watching

WAIT = 120  # seconds: a bound for a slow machine, never a measurement
NEVER = 3600.0  # a code poll that never comes due within a test


def _edit(path: Path, text: str) -> None:
    """Write ``text`` so that the file's signature surely changes (size or mtime)."""
    before = path.stat().st_mtime_ns
    path.write_text(text)
    if path.stat().st_mtime_ns == before:
        os.utime(path, ns=(before + 1_000_000, before + 1_000_000))


def _wait_for(condition) -> None:
    deadline = time.monotonic() + WAIT
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert condition()


@pytest.fixture
def files(tmp_path, monkeypatch):
    recipe, plugin = tmp_path / "r.yaml", tmp_path / "plugin.py"
    recipe.write_text("a")
    plugin.write_text("old")
    monkeypatch.setattr(watching, "code_paths", lambda: [plugin])
    monkeypatch.setattr(watching, "input_paths", lambda recipes, builds: [recipe])
    return recipe, plugin


def _start(built: list, said: list, restarted: threading.Event, **polls) -> threading.Thread:
    thread = threading.Thread(daemon=True, target=lambda: watching.watch(
        lambda planned: built.append(1), ["r.yaml"], say=said.append, restart=restarted.set, rounds=2, **polls))
    thread.start()
    _wait_for(lambda: said)  # the first build is done and its inputs watched
    return thread


@pytest.mark.parametrize("order", ["code first", "input first"])
def test_an_input_change_after_a_code_change_starts_afresh_instead_of_rebuilding(files, order):
    recipe, plugin = files
    built, said, restarted = [], [], threading.Event()
    # the code poll never comes due: only the check before a rebuild can see the new code
    thread = _start(built, said, restarted, poll=0.05, code_poll=NEVER)
    edits = [(plugin, "new code"), (recipe, "b")]
    for path, text in edits if order == "code first" else reversed(edits):
        _edit(path, text)
    assert restarted.wait(WAIT)
    thread.join(WAIT)
    assert built == [1] and said[-1] == "installed code changed: starting afresh"


def test_the_code_alone_changing_is_seen_on_its_own_poll(files):
    recipe, plugin = files
    built, said, restarted = [], [], threading.Event()
    thread = _start(built, said, restarted, poll=0.01, code_poll=0.02)
    _edit(plugin, "new code")
    assert restarted.wait(WAIT)
    thread.join(WAIT)
    assert built == [1]


def test_the_code_is_not_stated_on_every_input_poll(files, monkeypatch):
    recipe, plugin = files
    polled = {"code": 0, "inputs": 0}
    signatures = watching.signatures

    def counting(paths):
        paths = list(paths)
        polled["code" if [str(p) for p in paths] == [str(plugin)] else "inputs"] += 1
        return signatures(paths)

    monkeypatch.setattr(watching, "signatures", counting)
    built, said, restarted = [], [], threading.Event()
    thread = _start(built, said, restarted, poll=0.01, code_poll=NEVER)
    _wait_for(lambda: polled["inputs"] >= 20)  # many input polls, the code never due
    assert polled["code"] == 1  # its signature, taken after the first build
    _edit(recipe, "b")
    thread.join(WAIT)
    assert not thread.is_alive() and built == [1, 1] and said[-1] == "changed: r.yaml"
    # checked before the rebuild, and its signature taken again after it
    assert polled["code"] == 3 and not restarted.is_set()
