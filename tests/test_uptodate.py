"""The no-op fast path: a repeated run is answered from its stamp only while nothing it read
has changed. Each test runs the ``edgebuild`` entry point as a user would and tells a replayed
run from a full one by whether the CLI module was imported at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from edgebuild_testplugin.cli_runner import edgebuild


def run(*args, env=None):
    """``python -m edgebuild ...`` -> (process, replayed?, stderr without the import timings)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "edgebuild", *map(str, args)],
                          capture_output=True, text=True, env={**os.environ, **(env or {})})
    timings = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    stderr = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("import time:"))
    assert timings, "the interpreter printed no import timings"
    replayed = not any(line.rstrip().endswith(" edgebuild.cli.app") for line in timings)
    return done, replayed, stderr


def test_repeat_is_replayed_with_the_output_of_a_cached_run(project):
    recipe = project()
    first, replayed, _ = run("run", recipe)
    assert first.returncode == 0 and not replayed
    full = edgebuild("run", recipe, check=0)  # the CLI itself, always a full run
    again, replayed, stderr = run("run", recipe)
    assert again.returncode == 0 and replayed
    strip = lambda text: [line.rsplit(" ", 1)[0] for line in text.splitlines()]  # stage seconds differ
    assert strip(stderr) == strip(full.stderr)


def test_json_replay_matches_a_cached_run(project):
    recipe = project()
    run("run", recipe, "--json")
    full = json.loads(edgebuild("run", recipe, "--json", check=0).stdout)
    again, replayed, _ = run("run", recipe, "--json")
    assert replayed
    replay = json.loads(again.stdout)
    for variant in (full, replay):
        for v in variant["variants"]:
            for stage in v["stages"]:
                stage.pop("seconds")
    assert replay == full


def test_editing_the_recipe_or_source_falls_through(project):
    recipe = project()
    run("run", recipe)
    assert run("run", recipe)[1]
    recipe.write_text(recipe.read_text() + "\n# a comment changes the file\n")
    assert not run("run", recipe)[1]
    assert run("run", recipe)[1]
    from edgebuild_testplugin.models import tiny_model

    tiny_model(Path("tiny.onnx"), scale=3.0)
    done, replayed, _ = run("run", recipe, "--json")
    assert not replayed
    stages = {s["name"]: s["status"] for s in json.loads(done.stdout)["variants"][0]["stages"]}
    assert stages["import"] == "ran"


def test_changed_output_or_evicted_store_falls_through(project):
    recipe = project()
    run("run", recipe)
    artifact = Path("out/default/model/model.onnx")
    os.utime(artifact, ns=(1, 1))
    assert not run("run", recipe)[1]
    edgebuild("cache", "clear", check=0)
    done, replayed, _ = run("run", recipe, "--json")
    assert not replayed and done.returncode == 0
    assert any(s["status"] == "ran" for s in json.loads(done.stdout)["variants"][0]["stages"])


def test_flags_environment_and_plugins_are_part_of_the_stamp(project, tmp_path):
    recipe = project()
    run("run", recipe)
    assert not run("run", recipe, "--force")[1]
    assert not run("run", recipe, "--force")[1]  # --force always builds
    assert not run("run", recipe, "--json")[1]  # another command line has its own stamp
    site = tmp_path / "site"
    site.mkdir()
    env = {"PYTHONPATH": str(site)}
    assert not run("run", recipe, env=env)[1]
    assert run("run", recipe, env=env)[1]
    (site / "newplugin-1.0.dist-info").mkdir()  # what installing a distribution looks like
    assert not run("run", recipe, env=env)[1]


def test_failed_run_is_never_replayed(project):
    recipe = project()
    recipe.write_text(recipe.read_text().replace("tiny.onnx", "absent.onnx"))
    first, _, _ = run("run", recipe)
    assert first.returncode != 0
    again, replayed, _ = run("run", recipe)
    assert again.returncode == first.returncode and not replayed


def test_deleted_depfile_is_rewritten_on_replay(project):
    recipe = project()
    run("run", recipe, "--depfile", "deps.d")
    text = Path("deps.d").read_text()
    assert "recipe.yaml" in text and "tiny.onnx" in text
    Path("deps.d").unlink()
    assert run("run", recipe, "--depfile", "deps.d")[1]
    assert Path("deps.d").read_text() == text


def test_a_corrupt_stamp_means_a_full_run(project, tmp_path):
    recipe = project()
    run("run", recipe)
    (stamp,) = (tmp_path / "cache" / "stamps").glob("*.json")
    stamp.write_text('{"version": 1, "paths": ')  # cut short
    done, replayed, _ = run("run", recipe)
    assert done.returncode == 0 and not replayed


def test_a_stamp_that_cannot_be_written_does_not_fail_the_run(monkeypatch, tmp_path):
    from edgebuild.build import uptodate

    def refuse(path, text):
        raise PermissionError(13, "read-only cache", str(path))

    monkeypatch.setenv("EDGEBUILD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(uptodate, "entry_argv", ["run", "recipe.yaml"])
    attempts = []
    monkeypatch.setattr(uptodate, "_write_if_changed", lambda path, text: (attempts.append(path), refuse(path, text)))
    assert uptodate.record(files=[], touch=[], stderr=["done"]) is None  # no exception reaches the run
    assert len(attempts) == 1  # it did try to write the stamp
    assert not (tmp_path / "cache" / "stamps").exists()
    assert uptodate.replay(["run", "recipe.yaml"]) is None  # so the next run is a full one


def test_cache_gc_drops_stamps_unused_for_longer_than_its_age_limit(project, tmp_path):
    recipe = project()
    run("run", recipe)
    (stamp,) = (tmp_path / "cache" / "stamps").glob("*.json")
    assert run("run", recipe)[1]  # the replay touches its stamp
    edgebuild("cache", "gc", "--max-age-days", "1", check=0)
    assert stamp.exists()
    old = stamp.stat().st_mtime - 3 * 86400
    os.utime(stamp, (old, old))
    edgebuild("cache", "gc", "--max-age-days", "2", check=0)
    assert not stamp.exists()


def test_a_deleted_report_is_restored_by_the_next_run(project):
    """The stamp covers the output files: one gone means a full (cached) run, which writes it again."""
    recipe = project()
    run("run", recipe)
    out = Path("out/default")
    for name in ("report.json", "report.html"):
        (out / name).unlink()
        done, replayed, stderr = run("run", recipe)
        assert done.returncode == 0 and not replayed
        assert (out / name).exists(), f"{name} was not restored"
        report = json.loads((out / "report.json").read_text())
        assert (report["recipe"], report["variant"], report["status"]) == ("tiny", "default", "built")
        assert "<html" in (out / "report.html").read_text().lower()
        assert "report.html" in stderr and (out / "report.html").exists()  # the path printed exists
        assert run("run", recipe)[1]  # and the run after is up to date again
