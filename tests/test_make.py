"""Make trusts edgebuild's depfile only as far as a build deserves: the Makefile in docs/ci.md,
run as written with GNU Make on the test backend. Clean tree -> built; nothing changed -> nothing
to do; content changed -> rebuilt; touched only -> one cached run, then up to date; a missed
validation limit -> edgebuild's exit 3 fails make, and the next make fails again.

Also: Make reads every depfile path back as the file it names and never runs what a name holds."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgebuild_testplugin.cli_runner import log_lines
from edgebuild_testplugin.models import tiny_model

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU Make is not installed")

DOCS = Path(__file__).resolve().parent.parent / "docs" / "ci.md"
RECIPE = """\
edgebuild: 1
name: cnn
source:
  model: ../models/cnn.onnx
  inputs: {{x: {{shape: [2, 4], dtype: float32}}}}
target: {{backend: testcopy, precision: float32}}
validate: {{samples: 2, runtimes: [testcopy], thresholds: {{max_abs_max: 0.01}}}}
compression: {{level: {level}}}
variants:
  fp16: {{}}
outputs: {{dir: ../build/cnn}}
"""


def documented_makefile() -> str:
    """The ```make block of docs/ci.md, as written."""
    blocks = re.findall(r"```make\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1, "docs/ci.md should hold one Makefile"
    return blocks[0]


@pytest.fixture
def make(tmp_path, monkeypatch):
    """``make()`` in a project laid out as docs/ci.md's rule expects -> (exit code, output, stages run)."""
    (tmp_path / "models").mkdir()
    (tmp_path / "recipes").mkdir()
    tiny_model(tmp_path / "models" / "cnn.onnx")
    (tmp_path / "recipes" / "cnn.yaml").write_text(RECIPE.format(level=1))
    (tmp_path / "Makefile").write_text(documented_makefile())
    log = tmp_path / "log.txt"
    env = {**os.environ, "EDGEBUILD_CACHE_DIR": str(tmp_path / "cache"), "EDGEBUILD_TEST_LOG": str(log),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    monkeypatch.chdir(tmp_path)

    def run():
        before = len(log_lines(log))
        done = subprocess.run(["make"], capture_output=True, text=True, env=env, timeout=300)
        return done.returncode, done.stdout + done.stderr, log_lines(log)[before:]

    return run


def later(path: Path) -> None:
    """Make ``path`` newer than everything written so far, as a later edit would: the rest of the
    project is moved an hour back (no sleeping on the file system's clock resolution)."""
    past = time.time() - 3600
    for other in Path(".").rglob("*"):
        if other.is_file() and not other.is_symlink() and "cache" not in other.parts:
            os.utime(other, (past, past))
    os.utime(path)


STAMP = Path("build/cnn/fp16/.edgebuild-built")


def test_make_rebuilds_exactly_when_it_should(make):
    code, said, ran = make()
    assert code == 0, said
    assert "run recipes/cnn.yaml" in said and "package" in ran and STAMP.is_file()
    assert Path("build/deps/cnn-fp16.d").read_text().startswith("# edgebuild depfile")

    code, said, ran = make()
    assert code == 0 and "Nothing to be done for 'all'" in said and ran == [], said

    model = Path("models/cnn.onnx")
    tiny_model(model, scale=3.0)  # new content
    later(model)
    code, said, ran = make()
    assert code == 0 and "run recipes/cnn.yaml" in said and "lower:done" in ran, said
    code, said, ran = make()
    assert code == 0 and "Nothing to be done for 'all'" in said and ran == [], said

    later(model)  # touched, content unchanged: one cached run, then up to date
    code, said, ran = make()
    assert code == 0 and "run recipes/cnn.yaml" in said and ran == [], said
    code, said, ran = make()
    assert code == 0 and "Nothing to be done for 'all'" in said, said


def test_a_failed_validation_fails_every_make_until_fixed(make):
    assert make()[0] == 0
    recipe = Path("recipes/cnn.yaml")
    recipe.write_text(RECIPE.format(level=5))  # the candidate now misses max_abs_max
    later(recipe)
    code, said, _ = make()
    assert code == 2 and "Error 3" in said and "validation failed" in said, said
    assert not STAMP.exists() and Path("build/cnn/fp16/report.json").is_file()
    code, said, ran = make()
    assert code == 2 and "Error 3" in said and ran == [], said  # cached, and still a failure
    recipe.write_text(RECIPE.format(level=1))
    later(recipe)
    code, said, _ = make()
    assert code == 0 and STAMP.is_file(), said
    assert "Nothing to be done" in make()[1]


def test_a_broken_model_fails_every_make(make):
    assert make()[0] == 0
    Path("models/cnn.onnx").write_bytes(b"not an onnx model")
    later(Path("models/cnn.onnx"))
    code, said, _ = make()
    assert code == 2 and "not an ONNX model" in said, said
    code, said, _ = make()
    assert code == 2 and "not an ONNX model" in said, said  # and again, until the model is fixed


# -- names Make would read as something else ---------------------------------------------

HOSTILE_SOURCES = ["m$(shell touch PWNED).onnx", "m #1.onnx", "m%.onnx", "with space.onnx", "$HOME.onnx",
                   "a:b.onnx", "star*.onnx", "q?.onnx", "br[1].onnx", "~tilde.onnx", "m$$x.onnx", "m`touch PWNED`.onnx"]


@pytest.mark.parametrize("source", HOSTILE_SOURCES)
def test_make_reads_a_hostile_source_name_as_that_file(tmp_path, monkeypatch, source):
    from edgebuild.build.depfile import make_word

    monkeypatch.chdir(tmp_path)
    Path(source).write_bytes(b"x")
    (tmp_path / "decoy.onnx").write_bytes(b"x")  # a glob left unescaped would pull this in too
    rules = (f"out/v/.edgebuild-built: \\\n  {make_word(source)}\n"
             "all: out/v/.edgebuild-built\n\t$(file >got,$^)\n"
             "out/v/.edgebuild-built:\n\t$(file >made,$^)\n")
    Path("Makefile").write_text("all:\n" + rules)
    done = subprocess.run(["make", "all"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not Path("PWNED").exists()
    assert Path("made").read_text().strip() == source


@pytest.mark.parametrize("path", ["a\nb.onnx", "a;b.onnx", "a=b.onnx", "a|b.onnx", "a\\b.onnx", "lib(m.o)", "\t.onnx", ""])
def test_a_name_make_cannot_spell_is_refused(path):
    from edgebuild.build.depfile import make_word
    from edgebuild.errors import UsageError

    with pytest.raises(UsageError, match="Make cannot name"):
        make_word(path)


def test_a_hostile_source_through_run(project, cli, tmp_path):
    """End to end: a recipe whose model is named to run a command when make includes the depfile."""
    name = "m$(shell touch PWNED) #1.onnx"
    tiny_model(tmp_path / name)
    recipe = project().read_text().replace("model: tiny.onnx", f"model: {name!r}")
    Path("recipe.yaml").write_text(recipe)
    code, _, err = cli("run", "recipe.yaml", "--depfile", "deps.d")
    assert code == 0, err
    Path("Makefile").write_text("all: out/default/.edgebuild-built\n\t$(file >got,$^)\n-include deps.d\n"
                                "print:\n\t$(file >prereqs,$(filter-out %.yaml,$(^)))\n"
                                "print: out/default/.edgebuild-built\n")
    done = subprocess.run(["make", "-q", "all"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr  # up to date: the rule reads the right files
    assert not Path("PWNED").exists()


def test_an_existing_file_that_is_not_a_depfile_is_never_replaced(project, cli, tmp_path):
    project()
    Path("Makefile").write_text("all:\n\techo mine\n")
    code, _, err = cli("run", "recipe.yaml", "--depfile", "Makefile")
    assert code == 2 and "not an edgebuild depfile" in err and "Traceback" not in err, err
    assert Path("Makefile").read_text() == "all:\n\techo mine\n"
    assert not (tmp_path / "out").exists()


def test_a_depfile_inside_an_output_directory_is_refused(project, cli):
    project()
    code, _, err = cli("run", "recipe.yaml", "--depfile", "out/default/deps.d")
    assert code == 2 and "replaces on every build" in err, err


def test_a_replayed_run_never_writes_over_a_file_that_is_no_longer_its_depfile(project, tmp_path):
    """The up-to-date answer rewrites a deleted depfile; one replaced by someone else's file it
    leaves to the full run, which refuses it."""
    recipe = project()
    entry = [sys.executable, "-m", "edgebuild", "run", str(recipe), "--depfile", "deps.d"]
    assert subprocess.run(entry, capture_output=True).returncode == 0
    Path("deps.d").write_text("all:\n\techo mine\n")
    done = subprocess.run(entry, capture_output=True, text=True)
    assert done.returncode == 2 and "not an edgebuild depfile" in done.stderr, done.stderr
    assert Path("deps.d").read_text() == "all:\n\techo mine\n"


def test_a_failed_build_withdraws_the_stamp(tmp_path):
    from types import SimpleNamespace

    from edgebuild.build.outputs import BUILT_STAMP, OWNER_MARKER, withdraw_built

    out = tmp_path / "v"
    out.mkdir()
    (out / OWNER_MARKER).write_text("")
    (out / BUILT_STAMP).write_text("")
    withdraw_built(SimpleNamespace(output_dir=out))
    assert not (out / BUILT_STAMP).exists() and (out / OWNER_MARKER).exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / BUILT_STAMP).write_text("a user's file")  # no marker: not edgebuild's folder, left alone
    withdraw_built(SimpleNamespace(output_dir=mine))
    assert (mine / BUILT_STAMP).read_text() == "a user's file"
