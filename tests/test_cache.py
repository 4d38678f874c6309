"""The store and executor as a user meets them: cached reruns, partial rebuilds, corruption,
concurrent builds and interrupted builds. Uses the test plugin's copying backend."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from edgebuild_testplugin.cli_runner import edgebuild, log_lines, run_until_stage


def statuses(done) -> dict[str, str]:
    (variant,) = json.loads(done.stdout)["variants"]
    return {s["name"]: s["status"] for s in variant["stages"]}


def test_second_run_is_fully_cached(project):
    recipe = project()
    first = edgebuild("run", recipe, "--json", check=0)
    assert set(statuses(first).values()) >= {"ran"}
    second = edgebuild("run", recipe, "--json", check=0)
    assert statuses(second) == {name: "cached" for name in statuses(first)}
    out = Path("out/default")
    lock = json.loads((out / "edgebuild.lock.json").read_text())
    assert set(lock["stages"]) == {"import", "optimize", "lower", "package", "resolve"}
    assert (out / "model" / "model.onnx").exists() and (out / "report.html").exists()


def test_changing_compression_reruns_only_compression_and_after(project):
    edgebuild("run", project("compression: {level: 1}"), "--json", check=0)
    done = edgebuild("run", project("compression: {level: 2}"), "--json", check=0)
    assert statuses(done) == {"resolve": "cached", "import": "cached", "optimize": "cached",
                              "lower": "cached", "compress": "ran", "package": "ran"}
    assert json.loads(Path("out/default/model/compression.json").read_text()) == {"level": 2, "weights": None}


def test_plan_names_the_changed_input(project):
    edgebuild("run", project("compression: {level: 1}"), check=0)
    done = edgebuild("plan", project("compression: {level: 5}"), "--json", check=0)
    (variant,) = json.loads(done.stdout)["variants"]
    rows = {r["name"]: r for r in variant["stages"]}
    assert rows["lower"]["status"] == "cached"
    assert rows["compress"]["status"] == "would run"
    assert "parameters changed: compression" in rows["compress"]["reason"]
    assert rows["package"]["status"] == "would run" and "compress" in rows["package"]["reason"]


def test_corrupt_store_entry_is_rebuilt_not_served(project, tmp_path):
    recipe = project()
    first = edgebuild("run", recipe, "--json", check=0)
    (variant,) = json.loads(first.stdout)["variants"]
    key = next(s["key"] for s in variant["stages"] if s["name"] == "lower")
    stored = tmp_path / "cache" / "objects" / key[:2] / key / "out" / "model" / "model.onnx"
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different bytes
    stored.chmod(0o644)  # store files are read-only
    stored.write_bytes(bytes(data))
    Path("out").rename("out-old")  # make the build read the store again
    second = edgebuild("run", recipe, "--json", check=0)
    assert statuses(second)["lower"] == "ran"
    assert Path("out/default/model/model.onnx").read_bytes() == Path("tiny.onnx").read_bytes() or \
        Path("out/default/model/model.onnx").read_bytes() == Path("out-old/default/model/model.onnx").read_bytes()


def test_two_concurrent_runs_build_each_stage_once(project, tmp_path):
    recipe = project()
    env = {**os.environ, "EDGEBUILD_TEST_SLEEP": "1.5"}
    procs = [subprocess.Popen([sys.executable, "-m", "edgebuild.cli.app", "run", str(recipe), "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    lines = log_lines(tmp_path / "log.txt")
    assert lines.count("lower:done") == 1 and lines.count("package") == 1, lines


def test_sigint_mid_stage_leaves_nothing_half_written(project, tmp_path):
    recipe = project()
    proc = run_until_stage(recipe, tmp_path / "log.txt", "lower", sleep=30)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert not Path("out").exists()
    assert not list((tmp_path / "cache" / "tmp").glob("*"))  # no leftover temporaries
    stages = {json.loads(m.read_text())["stage"] for m in (tmp_path / "cache" / "objects").glob("*/*/meta.json")}
    assert "lower" not in stages
    done = edgebuild("run", recipe, "--json", check=0)
    assert statuses(done)["lower"] == "ran" and statuses(done)["import"] == "cached"


def test_no_cache_builds_without_touching_the_store(project, tmp_path):
    temporaries = tmp_path / "tmp"
    temporaries.mkdir()
    done = edgebuild("run", project(), "--no-cache", "--json", env={"TMPDIR": str(temporaries)}, check=0)
    assert all(s == "ran" for n, s in statuses(done).items() if n != "resolve")
    assert not (tmp_path / "cache" / "objects").exists()
    # the stage outputs were temporaries: the artifact is delivered, nothing is left behind
    (variant,) = json.loads(done.stdout)["variants"]
    assert all(Path(a).exists() for a in variant["artifacts"])
    assert list(temporaries.iterdir()) == []


def test_force_rebuilds_every_stage(project):
    recipe = project()
    edgebuild("run", recipe, check=0)
    done = edgebuild("run", recipe, "--force", "--json", check=0)
    assert all(s == "ran" for n, s in statuses(done).items() if n != "resolve")


def test_variants_share_the_common_prefix(project, tmp_path):
    recipe = project("variants:\n  a: {compression: {level: 1}}\n  b: {compression: {level: 2}}\n")
    done = edgebuild("run", recipe, "-j", "2", "--json", check=0)
    variants = json.loads(done.stdout)["variants"]
    assert [v["status"] for v in variants] == ["built", "built"]
    lines = log_lines(tmp_path / "log.txt")
    assert lines.count("lower:done") == 1 and lines.count("compress") == 2


def test_depfile_lists_recipe_and_local_source(project):
    recipe = project()
    edgebuild("run", recipe, "--depfile", "deps.d", check=0)
    header, _, rule = Path("deps.d").read_text().partition("\n")
    target, _, prereqs = rule.partition(":")
    assert header.startswith("# edgebuild depfile")
    assert target.strip() == os.path.join("out", "default", ".edgebuild-built")
    assert "recipe.yaml" in prereqs and "tiny.onnx" in prereqs


def test_cache_info_ls_gc_clear(project, tmp_path):
    edgebuild("run", project(), check=0)
    info = json.loads(edgebuild("cache", "info", "--json", check=0).stdout)
    assert info["entries"] >= 4 and info["bytes"] > 0
    rows = json.loads(edgebuild("cache", "ls", "--json", check=0).stdout)
    assert {r["stage"] for r in rows} >= {"import", "optimize", "lower", "package"}
    edgebuild("cache", "gc", "--max-size", "1", check=0)
    assert json.loads(edgebuild("cache", "info", "--json", check=0).stdout)["entries"] == 0
    edgebuild("run", project(), check=0)
    assert "evicted 0 entries" in edgebuild("cache", "gc", check=0).stdout  # no budget: only garbage goes
    assert json.loads(edgebuild("cache", "info", "--json", check=0).stdout)["entries"] >= 4
    edgebuild("cache", "clear", check=0)
    assert json.loads(edgebuild("cache", "info", "--json", check=0).stdout)["entries"] == 0
    assert edgebuild("cache", "gc", "--max-size", "lots").returncode == 2


def test_missing_source_is_a_clear_error(project):
    recipe = project()
    Path("tiny.onnx").unlink()
    done = edgebuild("run", recipe)
    assert done.returncode == 2
    assert "source.model: no such file 'tiny.onnx'" in done.stderr and "Traceback" not in done.stderr


def test_a_fully_cached_run_loads_no_model_library(project):
    recipe = project()
    edgebuild("run", recipe, check=0)
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "edgebuild.cli.app", "run", str(recipe)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    loaded = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "edgebuild.build.run" in loaded  # the full run, not the up-to-date answer
    assert not loaded & {"onnx", "onnx_ir", "onnxscript", "coremltools", "torch", "numpy"}
