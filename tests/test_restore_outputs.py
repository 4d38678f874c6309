"""Deleted output directories are written back from the stamp (edgebuild.build.restore) exactly as
the stamped run left them, or not at all: every doubt means a full run. Each test runs the
``edgebuild`` entry point as a user would and tells a restore from a full run by whether the CLI
module was imported."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from edgebuild_testplugin.cli_runner import edgebuild

OUT = Path("out")


def run(*args):
    """``python -m edgebuild ...`` -> (process, answered from the stamp?, stderr without the import timings)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "edgebuild", *map(str, args)],
                          capture_output=True, text=True)
    timings = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    stderr = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("import time:"))
    assert timings, "the interpreter printed no import timings"
    return done, not any(line.rstrip().endswith(" edgebuild.cli.app") for line in timings), stderr


def tree(root: Path) -> dict[str, tuple]:
    """Every file and directory below ``root``: (kind, mode, sha256 or None, inode if hard-linked)."""
    found = {}
    for path in sorted(root.rglob("*")):
        st = os.lstat(path)
        rel = path.relative_to(root).as_posix()
        if stat.S_ISDIR(st.st_mode):
            found[rel] = ("dir", stat.S_IMODE(st.st_mode), None, None)
        else:
            assert stat.S_ISREG(st.st_mode), f"{rel} is neither file nor directory"
            found[rel] = ("file", stat.S_IMODE(st.st_mode), hashlib.sha256(path.read_bytes()).hexdigest(),
                          st.st_ino if st.st_nlink > 1 else None)
    return found


def stamp_from_a_full_cached_run(recipe: Path, tmp_path: Path, *args) -> None:
    """Build, then forget the stamp and delete the outputs: the next run finds every stage cached."""
    assert run("run", recipe, *args)[0].returncode == 0
    for stamp in (tmp_path / "cache" / "stamps").glob("*.json"):
        stamp.unlink()
    shutil.rmtree(OUT)
    done, replayed, _ = run("run", recipe, *args)
    assert done.returncode == 0 and not replayed
    assert "ran" not in {s["status"] for s in json.loads((OUT / "default" / "report.json").read_text())["stages"]}


def test_deleted_outputs_are_written_back_as_the_full_cached_run_wrote_them(project, tmp_path):
    recipe = project()
    stamp_from_a_full_cached_run(recipe, tmp_path)
    before = tree(OUT)
    assert any(inode for _, _, _, inode in before.values()), "the artifact is not hard-linked from the store"
    shutil.rmtree(OUT)
    done, replayed, stderr = run("run", recipe)
    assert done.returncode == 0 and replayed
    assert "out/default/report.html" in stderr
    assert tree(OUT) == before  # bytes, modes, and the same store inodes for the linked files
    assert not [p for p in OUT.iterdir() if p.name.startswith(".")], "a temporary was left behind"
    again, replayed, _ = run("run", recipe)
    assert again.returncode == 0 and replayed
    assert tree(OUT) == before


def test_an_artifact_file_of_the_same_bytes_under_another_inode_is_linked_from_the_store(project):
    """A directory left alone as up to date may hold the entry's bytes under another inode (the
    entry's file was replaced by the same bytes since): written back, it links the store's file."""
    recipe = project()
    run("run", recipe)
    artifact = OUT / "default" / "model" / "model.onnx"
    store_file = next(p for p in Path("cache/objects").rglob("model.onnx") if p.stat().st_ino == artifact.stat().st_ino)
    copy = artifact.with_name("copy")
    shutil.copy2(artifact, copy)
    os.replace(copy, artifact)
    assert artifact.stat().st_ino != store_file.stat().st_ino
    done, replayed, _ = run("run", recipe)  # a full run, which finds the directory up to date
    assert done.returncode == 0 and not replayed
    assert artifact.stat().st_ino != store_file.stat().st_ino
    shutil.rmtree(OUT)
    done, replayed, _ = run("run", recipe)
    assert done.returncode == 0 and replayed
    assert artifact.stat().st_ino == store_file.stat().st_ino


def test_a_deleted_variant_directory_is_written_back_beside_the_comparison_page(project, tmp_path):
    recipe = project()
    stamp_from_a_full_cached_run(recipe, tmp_path)
    before = tree(OUT)
    page = (OUT / "index.html").stat()
    shutil.rmtree(OUT / "default")
    done, replayed, _ = run("run", recipe)
    assert done.returncode == 0 and replayed
    assert tree(OUT) == before
    assert (OUT / "index.html").stat().st_ino == page.st_ino  # the page, the stamped one, was left alone


def test_json_output_and_depfile_after_a_restore(project, tmp_path):
    recipe = project()
    args = ("--json", "--depfile", "deps.d")
    stamp_from_a_full_cached_run(recipe, tmp_path, *args)
    stdout = run("run", recipe, *args)[0].stdout
    shutil.rmtree(OUT)
    Path("deps.d").unlink()
    done, replayed, _ = run("run", recipe, *args)
    assert done.returncode == 0 and replayed
    assert done.stdout == stdout
    assert "out/default/.edgebuild-built" in Path("deps.d").read_text()
    built = (OUT / "default" / ".edgebuild-built").stat().st_mtime_ns
    assert built >= recipe.stat().st_mtime_ns  # Make sees the target newer than the recipe


def test_deleted_outputs_and_an_edited_recipe_mean_a_full_run(project):
    recipe = project()
    run("run", recipe)
    shutil.rmtree(OUT)
    recipe.write_text(recipe.read_text().replace("outputs: {dir: out}", "outputs: {dir: out}\n# edited"))
    done, replayed, _ = run("run", recipe)
    assert done.returncode == 0 and not replayed


def test_an_evicted_store_entry_means_a_full_run(project):
    recipe = project()
    run("run", recipe)
    shutil.rmtree(OUT)
    edgebuild("cache", "clear", check=0)
    done, replayed, _ = run("run", recipe, "--json")
    assert done.returncode == 0 and not replayed
    assert "ran" in {s["status"] for s in json.loads(done.stdout)["variants"][0]["stages"]}


def test_a_tampered_store_file_is_never_linked_into_the_outputs(project):
    recipe = project()
    run("run", recipe)
    artifact = OUT / "default" / "model" / "model.onnx"
    good = artifact.read_bytes()
    store_file = next(p for p in Path("cache/objects").rglob("model.onnx") if p.stat().st_ino == artifact.stat().st_ino)
    shutil.rmtree(OUT)
    st = store_file.stat()
    store_file.chmod(0o644)
    store_file.write_bytes(bytes(b ^ 0xFF for b in good))  # same size; mtime put back below
    os.utime(store_file, ns=(st.st_atime_ns, st.st_mtime_ns))
    store_file.chmod(0o444)
    done, replayed, _ = run("run", recipe)
    assert done.returncode == 0 and not replayed
    assert artifact.read_bytes() == good  # the full run found the entry corrupt and built it again


def test_a_missing_or_altered_blob_means_a_full_run(project, tmp_path):
    recipe = project()
    blobs = tmp_path / "cache" / "stamps" / "blobs"
    run("run", recipe)
    assert list(blobs.iterdir())
    shutil.rmtree(OUT)
    for blob in blobs.iterdir():
        blob.write_text("not what the stamp recorded\n")
    done, replayed, _ = run("run", recipe)
    assert done.returncode == 0 and not replayed
    assert json.loads((OUT / "default" / "report.json").read_text())["variant"] == "default"
    shutil.rmtree(OUT)
    shutil.rmtree(blobs)
    done, replayed, _ = run("run", recipe)
    assert done.returncode == 0 and not replayed
    assert (OUT / "default" / "report.html").exists()


def test_a_foreign_file_in_the_output_path_is_left_to_the_full_run(project):
    recipe = project()
    run("run", recipe)
    shutil.rmtree(OUT / "default")
    (OUT / "default").write_text("mine\n")
    done, replayed, stderr = run("run", recipe)
    assert done.returncode == 2 and not replayed
    assert "is a file" in stderr and "Traceback" not in stderr
    assert (OUT / "default").read_text() == "mine\n"  # not edgebuild's: untouched


def test_another_variant_report_beside_the_variants_means_a_full_run(project):
    """The comparison page lists every */report.json of the folder: the full run draws it again."""
    recipe = project()
    run("run", recipe)
    shutil.rmtree(OUT / "default")
    (OUT / "other").mkdir()
    (OUT / "other" / "report.json").write_text("{}\n")
    done, replayed, _ = run("run", recipe)
    assert done.returncode == 0 and not replayed
    assert (OUT / "other" / "report.json").read_text() == "{}\n"
    assert (OUT / "default" / "report.json").exists()


def test_a_file_beside_the_variants_stays_and_the_directory_is_written_back(project):
    """Not a variant's report, so not on the page (a convert's record sits there, say)."""
    recipe = project()
    run("run", recipe)
    (OUT / "notes.txt").write_text("mine\n")
    shutil.rmtree(OUT / "default")
    done, replayed, _ = run("run", recipe)
    assert done.returncode == 0 and replayed
    assert (OUT / "notes.txt").read_text() == "mine\n"
    assert (OUT / "default" / "report.json").exists()


def test_a_partly_deleted_output_directory_means_a_full_run(project):
    recipe = project()
    run("run", recipe)
    shutil.rmtree(OUT / "default" / "model")
    done, replayed, _ = run("run", recipe)
    assert done.returncode == 0 and not replayed
    assert (OUT / "default" / "model" / "model.onnx").exists()


def test_a_restore_that_loses_the_race_leaves_nothing_half_written(project, tmp_path, monkeypatch):
    """Another run takes the directory's place between the checks and the rename: the temporary
    goes, what took the place stays, and the answer is "not restored"."""
    from edgebuild.build import restore, uptodate

    recipe = project()
    run("run", recipe)
    shutil.rmtree(OUT / "default")
    (stamp_path,) = (tmp_path / "cache" / "stamps").glob("*.json")
    stamp = json.loads(stamp_path.read_text())
    changed = {p for p, sig in stamp["paths"].items() if uptodate._signature(p) != sig}
    rename = os.rename

    def concurrent_run_wins(src, dst):
        os.mkdir(dst)
        (Path(dst) / "theirs").write_text("another run's\n")
        rename(src, dst)

    monkeypatch.setattr(restore.os, "rename", concurrent_run_wins)
    assert restore.restore(stamp["restore"], changed, stamp_path.parent / "blobs", stamp["paths"]) is None
    assert sorted(p.name for p in OUT.iterdir()) == ["default", "index.html"]
    assert [p.name for p in (OUT / "default").iterdir()] == ["theirs"]


def test_cache_clear_and_gc_remove_the_blobs(project, tmp_path):
    recipe = project()
    blobs = tmp_path / "cache" / "stamps" / "blobs"
    run("run", recipe)
    assert run("run", recipe)[1]  # the replay touches the stamp and its blobs
    edgebuild("cache", "gc", "--max-age-days", "1", check=0)
    assert list(blobs.iterdir())
    old = blobs.stat().st_mtime - 3 * 86400
    for path in [*blobs.iterdir(), *(tmp_path / "cache" / "stamps").glob("*.json")]:
        os.utime(path, (old, old))
    edgebuild("cache", "gc", "--max-age-days", "2", check=0)
    assert not list(blobs.iterdir())
    run("run", recipe)  # a full run, stamped again
    assert list(blobs.iterdir())
    edgebuild("cache", "clear", check=0)
    assert not (tmp_path / "cache" / "stamps").exists()


def test_a_stamp_naming_a_file_outside_its_directory_means_a_full_run(project, tmp_path):
    recipe = project()
    run("run", recipe)
    [stamp_path] = (tmp_path / "cache" / "stamps").glob("*.json")
    stamp = json.loads(stamp_path.read_text())
    [first] = stamp["restore"]["dirs"]
    named = os.path.join(first["path"], first["files"][0][0])
    first["files"][0][0] = "../escaped"  # and the stamp watching that name, so only the guard refuses it
    stamp["paths"][os.path.join(first["path"], "../escaped")] = stamp["paths"].pop(named)
    stamp_path.write_text(json.dumps(stamp))
    shutil.rmtree(OUT)
    done, replayed, _ = run("run", recipe)
    assert done.returncode == 0 and not replayed
    assert not (OUT / "escaped").exists() and not Path("escaped").exists()
    assert (OUT / "default" / "report.html").exists()
