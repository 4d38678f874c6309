"""`cache gc` and `cache clear` while a build runs: the entries the build holds (its lease) stay,
the build succeeds, and gc says what it kept. Their limits are checked: sizes and ages >= 0, finite.

The build is held at a known point — the test plugin's ``test_noop`` pass waits at a gate folder
while a file ``armed`` is in it — so the race is the same every time, without timing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgebuild_testplugin.cli_runner import assert_usage_error, edgebuild

GATED = "optimize: {passes: {test_noop: true}}"
TWO_VARIANTS = """variants:
  a: {}
  b: {optimize: {passes: {test_noop: true}}}"""


def wait_for(predicate, what: str, limit: float = 120.0):
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def start_gated_build(recipe: Path, gate: Path) -> subprocess.Popen:
    """``edgebuild run --json RECIPE`` in the background, returned once it waits in the optimize stage."""
    gate.mkdir()
    (gate / "armed").touch()
    env = {**os.environ, "EDGEBUILD_TEST_GATE": str(gate)}
    proc = subprocess.Popen([sys.executable, "-m", "edgebuild.cli.app", "run", str(recipe), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    wait_for(lambda: any(gate.glob("running-*")) or proc.poll() is not None, "the build to reach the gate")
    assert proc.poll() is None, proc.communicate()
    return proc


def entry_keys(cache: Path) -> set[str]:
    return {p.parent.name for p in (cache / "objects").glob("*/*/meta.json")}


@pytest.mark.parametrize("housekeeping", [
    ["gc", "--max-size", "0"],
    ["gc", "--max-age-days", "0"],
    ["clear"],
    ["gc", "--max-size", "0", "+", "clear"],
])
def test_housekeeping_during_a_build_keeps_what_the_build_uses(project, tmp_path, housekeeping):
    cache = tmp_path / "cache"
    # an earlier build of another recipe: entries nobody uses now
    earlier = edgebuild("run", project("compression: {level: 7}", name="other.yaml"), "--json", check=0)
    unused = {s["key"] for s in json.loads(earlier.stdout)["variants"][0]["stages"] if s["name"] != "resolve"}
    # variant a is built whole (its outputs are written at the end of the run), then b waits in optimize
    proc = start_gated_build(project(TWO_VARIANTS), tmp_path / "gate")
    outputs = []
    for command in " ".join(housekeeping).split(" + "):
        outputs.append(edgebuild("cache", *command.split(), check=0).stdout)
    kept = entry_keys(cache)
    (tmp_path / "gate" / "open").touch()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "FileNotFoundError" not in err and "Traceback" not in err, err
    variants = {v["variant"]: v for v in json.loads(out)["variants"]}
    assert {v["status"] for v in variants.values()} == {"built"}
    assert Path("out/a/model/model.onnx").is_file() and Path("out/b/model/model.onnx").is_file()
    used = {s["key"] for s in variants["a"]["stages"] if s["name"] != "resolve"} | \
           {s["key"] for s in variants["b"]["stages"] if s["name"] == "import"}
    assert kept == used  # what the running build had used, and nothing else
    assert unused - used  # there was something to remove
    assert outputs[0].rstrip().endswith(f"; kept {len(used)} entries a running build uses"), outputs[0]
    # the build over, its lease is gone: the same clean-up now removes everything
    edgebuild("cache", "gc", "--max-size", "0", check=0)
    assert entry_keys(cache) == set()


def test_a_killed_builds_lease_holds_nothing(project, tmp_path):
    recipe = project(GATED)
    cache = tmp_path / "cache"
    proc = start_gated_build(recipe, tmp_path / "gate")
    assert entry_keys(cache)  # the import entry, held
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    done = edgebuild("cache", "gc", "--max-size", "0", check=0)
    assert "kept" not in done.stdout, done.stdout
    assert entry_keys(cache) == set()
    assert list((cache / "leases").glob("*")) == []  # the dead build's lease files were removed


def test_a_lease_holds_keys_against_gc_in_the_same_process(tmp_path):
    """Threads of one process: the second store object's gc skips what the first holds, and a
    build that starts using an entry while gc moves it aside gets it back whole."""
    from edgebuild.store.local import Store

    builder, cleaner = Store(tmp_path / "store"), Store(tmp_path / "store")
    key, other = "a" * 64, "b" * 64
    for k in (key, other):
        builder.build(k, "test", lambda out: (out / "f.txt").write_text("x") and {})
    builder.release()
    builder = Store(tmp_path / "store")
    assert builder.lookup(key) is not None  # holds ``key`` from here on
    removed, problems = cleaner.gc(max_bytes=0)
    assert [e.key for e in removed] == [other] and problems.held == [key] and not list(problems)
    assert (builder.lookup(key).out / "f.txt").read_text() == "x"

    # moved aside, then found held on the second look: moved back before anything is deleted
    real = cleaner.held_keys
    looks = iter([set(), {key}])
    cleaner.held_keys = lambda: next(looks)
    builder.release()
    problems = cleaner._remove_entry(cleaner._dir(key), unless_held=True)
    cleaner.held_keys = real
    assert problems.held == [key]
    assert (Store(tmp_path / "store").lookup(key).out / "f.txt").read_text() == "x"


@pytest.mark.parametrize("args, phrase", [
    (["--max-size", "-5G"], "--max-size '-5G' must be >= 0"),
    (["--max-size", "nan"], "--max-size 'nan' is not a size"),
    (["--max-size", "inf"], "--max-size 'inf' is not a size"),
    (["--max-size", "1e999"], "must be a finite number >= 0"),
    (["--max-size", "lots"], "--max-size 'lots' is not a size"),
    (["--max-size", ""], "--max-size '' is not a size"),
    (["--max-age-days", "-1"], "--max-age-days -1.0 must be a finite number >= 0"),
    (["--max-age-days", "nan"], "--max-age-days nan must be a finite number >= 0"),
    (["--max-age-days", "inf"], "--max-age-days inf must be a finite number >= 0"),
])
def test_gc_limits_must_be_finite_and_not_negative(project, tmp_path, cli, args, phrase):
    edgebuild("run", project(), check=0)
    before = entry_keys(tmp_path / "cache")
    code, _, err = cli("cache", "gc", *args)
    assert_usage_error(code, err, phrase)
    assert entry_keys(tmp_path / "cache") == before  # nothing evicted


def test_gc_limits_that_are_sizes_still_work(project, tmp_path, cli):
    edgebuild("run", project(), check=0)
    code, out, err = cli("cache", "gc", "--max-size", "1.5GiB", "--max-age-days", "30")
    assert code == 0, err
    assert "evicted 0 entries" in out and entry_keys(tmp_path / "cache")
    code, out, err = cli("cache", "gc", "--max-size", "0")
    assert code == 0 and entry_keys(tmp_path / "cache") == set(), err
