"""Outputs never destroy user files: edgebuild replaces only the output directories it made
(a marker file), never through a symlink, never one holding the recipe, a source or the cache,
and refuses everything else with exit 2 before any build work. Outputs get the usual modes.

Most cases run the CLI in-process (``main()``) to stay fast; the permission tests run it in a
subprocess, whose umask the test sets."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from edgebuild_testplugin.cli_runner import log_lines
from edgebuild_testplugin.recipes import RECIPE
from edgebuild_testplugin.models import tiny_model

MARKER = ".edgebuild-output"


def recipe_text(outputs_dir: str, variants: str = "", source: str = "tiny.onnx", extra: str = "") -> str:
    text = RECIPE.format(extra=extra).replace("outputs: {dir: out}", f"outputs: {{dir: {outputs_dir!r}}}")
    text = text.replace("model: tiny.onnx", f"model: {source}")
    return text + (f"variants:\n{variants}" if variants else "")


def snapshot(root: Path) -> dict:
    """Every file and link below ``root`` with its bytes (or target): what must survive."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            found[str(path.relative_to(root))] = "-> " + os.readlink(path)
        elif path.is_file():
            found[str(path.relative_to(root))] = path.read_bytes()
    return found


def refused(done, tmp_path, *words):
    """Exit 2 with a message naming the fix, and nothing built."""
    code, _, err = done
    assert code == 2, err
    assert "Traceback" not in err and "hint:" in err, err
    for word in words:
        assert word in err, err
    assert log_lines(tmp_path / "log.txt") == []  # no stage body ran
    assert not (tmp_path / "cache" / "objects").exists()


# -- hostile output locations ------------------------------------------------------------

def test_variant_named_like_the_source_folder_is_refused(project, tmp_path, cli):
    """outputs.dir "." and a variant called ``models``: the recipe's own source model lives there."""
    (tmp_path / "models").mkdir()
    tiny_model(tmp_path / "models" / "tiny.onnx")
    (tmp_path / "recipe.yaml").write_text(recipe_text(".", "  models: {}\n", source="models/tiny.onnx"))
    before = snapshot(tmp_path / "models")
    refused(cli("run", "recipe.yaml"), tmp_path, "models", "which the build reads", "choose another outputs.dir")
    assert snapshot(tmp_path / "models") == before


def test_output_directory_holding_the_recipe_is_refused(project, tmp_path, cli):
    """outputs.dir ".." with a variant named like the recipe's own directory."""
    project_dir = tmp_path / "proj"
    project_dir.mkdir()
    tiny_model(project_dir / "tiny.onnx")
    (project_dir / "recipe.yaml").write_text(recipe_text("..", "  proj: {}\n"))
    before = snapshot(project_dir)
    refused(cli("run", project_dir / "recipe.yaml"), tmp_path, "recipe.yaml", "which the build reads")
    assert snapshot(project_dir) == before


def test_output_directory_holding_an_extended_recipe_is_refused(project, tmp_path, cli):
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "parent.yaml").write_text("target: {backend: testcopy}\n")
    (tmp_path / "recipe.yaml").write_text("extends: base/parent.yaml\n" + recipe_text(".", "  base: {}\n"))
    refused(cli("run", "recipe.yaml"), tmp_path, "parent.yaml")
    assert (tmp_path / "base" / "parent.yaml").read_text() == "target: {backend: testcopy}\n"


@pytest.mark.parametrize("name", ["../../victim", "../victim", "/victim"])
def test_variant_name_escaping_outputs_dir_never_touches_the_victim(project, tmp_path, cli, name):
    """Refused at recipe load or at planning; either way exit 2 and the victim intact."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    (tmp_path / "recipe.yaml").write_text(recipe_text("out/deeper", f"  {name!r}: {{}}\n"))
    code, _, err = cli("run", "recipe.yaml")
    assert code == 2 and "Traceback" not in err, err
    assert (victim / "precious.txt").read_text() == "keep me"
    assert log_lines(tmp_path / "log.txt") == []


@pytest.mark.parametrize("name", ["..", "../victim", "../../victim", "a/b", "/victim", ".", ""])
def test_resolved_output_path_stays_inside_outputs_dir(project, tmp_path, name):
    """Defence in depth below the recipe loader's name check: planning itself refuses."""
    from edgebuild.build.jobs import Build
    from edgebuild.build.outputs import check_output_dir, output_location
    from edgebuild.dag.executor import Job
    from edgebuild.errors import UsageError
    from edgebuild.recipe import load_recipe

    (variant,) = load_recipe(project())
    variant.name = name
    root, out = output_location(variant)
    with pytest.raises(UsageError, match="outside|root"):
        check_output_dir(Build(variant, Job("t", []), out, "model", outputs_root=root))


def test_symlinked_variant_directory_is_refused_not_followed(project, tmp_path, cli):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    (victim / MARKER).write_text("even a marker behind a link does not make it ours")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "default").symlink_to(victim, target_is_directory=True)
    project()
    before = snapshot(victim)
    refused(cli("run", "recipe.yaml"), tmp_path, "symlink", "remove the link")
    assert snapshot(victim) == before
    assert (tmp_path / "out" / "default").is_symlink()


def test_outputs_dir_behind_a_symlink_is_written_inside_its_target(project, tmp_path, cli):
    """A build volume linked in as outputs.dir is fine: edgebuild writes a variant directory in it."""
    volume = tmp_path / "volume"
    volume.mkdir()
    (volume / "other.txt").write_text("someone else's")
    (tmp_path / "out").symlink_to(volume, target_is_directory=True)
    project()
    code, _, err = cli("run", "recipe.yaml")
    assert code == 0, err
    assert (volume / "default" / MARKER).is_file() and (volume / "default" / "model" / "model.onnx").is_file()
    assert (volume / "other.txt").read_text() == "someone else's" and (tmp_path / "out").is_symlink()


def test_root_as_outputs_dir_is_refused(project, tmp_path, cli):
    name = f"edgebuild-victim-{os.getpid()}"
    (tmp_path / "recipe.yaml").write_text(recipe_text("/", f"  {name}: {{}}\n"))
    try:
        refused(cli("run", "recipe.yaml"), tmp_path, "file system root")
    finally:
        assert not Path("/", name).exists()


@pytest.mark.parametrize("outputs_dir", ["afile", "afile/sub"])
def test_outputs_dir_that_is_a_file_is_refused(project, tmp_path, cli, outputs_dir):
    (tmp_path / "afile").write_text("not a directory")
    (tmp_path / "recipe.yaml").write_text(recipe_text(outputs_dir))
    refused(cli("run", "recipe.yaml"), tmp_path, "is a file")
    assert (tmp_path / "afile").read_text() == "not a directory"


def test_variant_path_that_is_a_file_is_refused(project, tmp_path, cli):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "default").write_text("a user's file")
    project()
    refused(cli("run", "recipe.yaml"), tmp_path, "is a file")
    assert (tmp_path / "out" / "default").read_text() == "a user's file"


def test_directory_edgebuild_did_not_make_is_refused(project, tmp_path, cli):
    (tmp_path / "out" / "default").mkdir(parents=True)
    (tmp_path / "out" / "default" / "notes.txt").write_text("mine")
    project()
    refused(cli("run", "recipe.yaml"), tmp_path, "not made by edgebuild", "remove it", "choose another outputs.dir")
    assert (tmp_path / "out" / "default" / "notes.txt").read_text() == "mine"


def test_marker_that_is_a_symlink_does_not_make_a_directory_ours(project, tmp_path, cli):
    out = tmp_path / "out" / "default"
    out.mkdir(parents=True)
    (tmp_path / "elsewhere").write_text("x")
    (out / MARKER).symlink_to(tmp_path / "elsewhere")
    (out / "notes.txt").write_text("mine")
    project()
    refused(cli("run", "recipe.yaml"), tmp_path, "not made by edgebuild")
    assert (out / "notes.txt").read_text() == "mine"


def test_output_directory_overlapping_the_cache_is_refused(project, tmp_path, cli, monkeypatch):
    monkeypatch.setenv("EDGEBUILD_CACHE_DIR", str(tmp_path / "out" / "default" / "cache"))
    (tmp_path / "out" / "default" / "cache").mkdir(parents=True)
    project()
    code, _, err = cli("run", "recipe.yaml")
    assert code == 2 and "overlaps the cache" in err and "hint:" in err, err
    assert log_lines(tmp_path / "log.txt") == []


def test_plan_refuses_too(project, tmp_path, cli):
    (tmp_path / "out" / "default").mkdir(parents=True)
    (tmp_path / "out" / "default" / "notes.txt").write_text("mine")
    project()
    code, _, err = cli("plan", "recipe.yaml")
    assert code == 2 and "not made by edgebuild" in err, err


# -- directories edgebuild made ------------------------------------------------------------

def test_empty_directory_is_taken_and_marked(project, tmp_path, cli):
    (tmp_path / "out" / "default").mkdir(parents=True)
    project()
    code, _, err = cli("run", "recipe.yaml")
    assert code == 0, err
    assert (tmp_path / "out" / "default" / MARKER).is_file()


def test_own_directory_is_replaced_without_following_links_inside(project, tmp_path, cli):
    """A link someone put inside an output directory goes with the directory; its target stays."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    code, _, err = cli("run", project("compression: {level: 1}"))
    assert code == 0, err
    out = tmp_path / "out" / "default"
    (out / "link").symlink_to(victim, target_is_directory=True)
    (out / "model" / "link").symlink_to(victim / "precious.txt")
    code, _, err = cli("run", project("compression: {level: 2}"))  # a change: the directory is rewritten
    assert code == 0, err
    assert not (out / "link").exists() and (out / MARKER).is_file()
    assert (victim / "precious.txt").read_text() == "keep me"
    assert '"level": 2' in (out / "model" / "compression.json").read_text()


def test_output_directory_of_an_earlier_version_without_marker_is_still_ours(project, tmp_path, cli):
    """Only a lock file, reports and the artifact: what edgebuild wrote before the marker existed."""
    code, _, err = cli("run", project("compression: {level: 1}"))
    assert code == 0, err
    out = tmp_path / "out" / "default"
    (out / MARKER).unlink()
    code, _, err = cli("run", project("compression: {level: 2}"))
    assert code == 0, err
    assert (out / MARKER).is_file()
    (out / MARKER).unlink()
    (out / "notes.txt").write_text("mine")  # now it holds something edgebuild never writes
    code, _, err = cli("run", project("compression: {level: 3}"))
    assert code == 2 and "not made by edgebuild" in err, err
    assert (out / "notes.txt").read_text() == "mine"


# -- permissions ---------------------------------------------------------------------------

def run_with_umask(mask: int, *args):
    old = os.umask(mask)
    try:
        return subprocess.run([sys.executable, "-m", "edgebuild.cli.app", *map(str, args)], capture_output=True, text=True)
    finally:
        os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_outputs_get_the_usual_modes_and_artifacts_link_only_read_only_store_files(project, tmp_path, mask):
    recipe = project("variants:\n  a: {}\n  b: {compression: {level: 2}}\n")
    done = run_with_umask(mask, "run", recipe)
    assert done.returncode == 0, done.stderr
    mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)
    out = tmp_path / "out"
    for variant in ("a", "b"):
        folder = out / variant
        assert mode(folder) == 0o777 & ~mask and mode(folder / "model") == 0o777 & ~mask
        for name in ("report.json", "report.html", "edgebuild.lock.json", MARKER):
            assert mode(folder / name) == 0o666 & ~mask, name
        artifact = folder / "model" / "model.onnx"
        assert mode(artifact) == 0o444 & ~mask  # read-only, readable as the umask allows
        assert os.stat(artifact).st_nlink > 1  # a hard link into the store ...
        store_files = [p for p in (tmp_path / "cache" / "objects").rglob("model.onnx") if os.path.samefile(p, artifact)]
        assert store_files and all(mode(p) == 0o444 & ~mask for p in store_files)  # ... to a read-only file
    assert mode(out / "index.html") == 0o666 & ~mask  # the comparison page of both variants
    assert mode(tmp_path / "cache" / "objects") == 0o777 & ~mask


def test_store_file_is_linked_only_once_read_only_else_copied(tmp_path, monkeypatch):
    from edgebuild.store.links import link_or_copy

    src = tmp_path / "store-file"
    src.write_bytes(b"weights")
    link_or_copy(src, tmp_path / "linked")
    assert os.path.samefile(src, tmp_path / "linked") and not src.stat().st_mode & 0o222
    src.chmod(0o644)

    real_chmod = os.chmod

    def refuse(path, *args, **kwargs):  # a store file the user may read but not change
        if str(path) == str(src):
            raise PermissionError(1, "Operation not permitted")
        return real_chmod(path, *args, **kwargs)

    monkeypatch.setattr(os, "chmod", refuse)
    link_or_copy(src, tmp_path / "copied")
    assert not os.path.samefile(src, tmp_path / "copied") and (tmp_path / "copied").read_bytes() == b"weights"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write to read-only files; the store's ctime check "
                    "(tests/reliability/test_store.py) covers that case")
def test_editing_a_delivered_artifact_in_place_cannot_reach_the_store(project, tmp_path, cli):
    code, _, err = cli("run", project())
    assert code == 0, err
    with pytest.raises(PermissionError):
        open(tmp_path / "out" / "default" / "model" / "model.onnx", "r+b")
