"""Mistaken command-line arguments: exit 2 with the fix in the message, before any build work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgebuild.protocols import Runtime
from edgebuild_testplugin.cli_runner import assert_usage_error

RECIPE = """\
edgebuild: 1
name: tiny
source:
  model: m.onnx
  inputs: {x: {shape: [2, 4], dtype: float32}}
target: {backend: testcopy, precision: float32}
outputs: {dir: out}
"""


def write_model(path: Path, input_name: str = "x") -> Path:
    """y = input * w, the input float32 [n, 4]."""
    w = numpy_helper.from_array(np.full((4,), 2.0, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Mul", [input_name, "w"], ["y"])], "tiny",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A recipe on a tiny model with the test backend; the stage log shows any build work."""
    write_model(tmp_path / "m.onnx")
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EDGEBUILD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("EDGEBUILD_TEST_LOG", str(tmp_path / "log.txt"))
    return tmp_path


def assert_nothing_built(root: Path) -> None:
    assert not (root / "log.txt").exists(), (root / "log.txt").read_text()
    assert not (root / "out").exists()


def test_the_project_builds(project, cli):
    """The baseline every other test breaks one thing of."""
    code, _, err = cli("run", "recipe.yaml")
    assert code == 0, err
    assert (project / "out" / "default" / "model").is_dir()


@pytest.mark.parametrize("command", ["run", "validate"])
def test_recipe_path_that_is_a_directory(project, cli, command):
    (project / "recipes").mkdir()
    code, _, err = cli(command, "recipes")
    assert_usage_error(code, err, "recipes: is a directory, not a recipe file", "recipes/recipe.yaml")
    assert_nothing_built(project)


@pytest.mark.parametrize("command", ["run", "validate"])
def test_recipe_that_does_not_exist(project, cli, command):
    code, _, err = cli(command, "nope.yaml")
    assert_usage_error(code, err, "nope.yaml: no such recipe file")


def test_depfile_that_is_a_directory(project, cli):
    (project / "deps").mkdir()
    code, _, err = cli("run", "recipe.yaml", "--depfile", "deps")
    assert_usage_error(code, err, "--depfile deps: is a directory", "deps/edgebuild.d")
    assert_nothing_built(project)


def test_depfile_in_a_missing_directory_is_made(project, cli):
    code, _, err = cli("run", "recipe.yaml", "--depfile", "no/such/dir/x.d")
    assert code == 0, err
    assert (project / "no/such/dir/x.d").read_text().startswith("# edgebuild depfile")


def test_depfile_below_a_file(project, cli):
    (project / "plain").write_text("a file")
    code, _, err = cli("run", "recipe.yaml", "--depfile", "plain/x.d")
    assert_usage_error(code, err, "--depfile plain/x.d", "is a file, not a directory")
    assert_nothing_built(project)


@pytest.mark.parametrize("extra", [[], ["--no-cache"]], ids=["cached", "no-cache"])
def test_cache_dir_that_is_a_file(project, cli, extra):
    (project / "cachefile").write_text("not a directory")
    code, _, err = cli("run", "recipe.yaml", "--cache-dir", "cachefile", *extra)
    assert_usage_error(code, err, "--cache-dir", "cachefile: is a file, not a directory", "--cache-dir or EDGEBUILD_CACHE_DIR")
    assert_nothing_built(project)
    assert (project / "cachefile").read_text() == "not a directory"


def test_cache_dir_from_the_environment_that_is_a_file(project, cli, monkeypatch):
    (project / "cachefile").write_text("x")
    monkeypatch.setenv("EDGEBUILD_CACHE_DIR", str(project / "cachefile"))
    code, _, err = cli("run", "recipe.yaml", "--no-cache")
    assert_usage_error(code, err, "EDGEBUILD_CACHE_DIR", "is a file")
    assert_nothing_built(project)


def test_cache_dir_that_cannot_be_created(project, cli):
    (project / "file").write_text("x")
    code, _, err = cli("run", "recipe.yaml", "--cache-dir", "file/cache")
    assert_usage_error(code, err, "not writable")
    assert_nothing_built(project)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes to read-only directories")
def test_cache_dir_that_is_read_only(project, cli):
    (project / "ro").mkdir(mode=0o555)
    try:
        code, _, err = cli("run", "recipe.yaml", "--cache-dir", "ro")
    finally:
        (project / "ro").chmod(0o755)
    assert_usage_error(code, err, "not writable")
    assert_nothing_built(project)


@pytest.mark.parametrize("jobs", ["0", "100000"])
def test_jobs_out_of_range(project, cli, jobs):
    code, _, err = cli("run", "recipe.yaml", "-j", jobs)
    assert_usage_error(code, err, "-j")
    assert_nothing_built(project)


def test_variant_name_that_climbs_out_of_the_outputs(project, cli):
    """A hostile variant name is refused at load: the directory it names is never touched."""
    victim = project.parent / f"{project.name}-victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    (project / "recipe.yaml").write_text(RECIPE + f"variants:\n  ../../{victim.name}: {{}}\n")
    code, _, err = cli("run", "recipe.yaml")
    assert_usage_error(code, err, "recipe.yaml:9:3", "not a valid variant name")
    assert (victim / "precious.txt").read_text() == "keep me"
    assert_nothing_built(project)


def test_unknown_variant_on_the_command_line(project, cli):
    code, _, err = cli("run", "recipe.yaml", "--variant", "../../x")
    assert_usage_error(code, err, "no variant '../../x'; the recipe has default")
    assert_nothing_built(project)


@pytest.mark.parametrize("change, phrase", [
    (("x: {shape", "q: {shape"), "recipe.yaml:5:12 source.inputs.q: the model has no input 'q'"),
    (("[2, 4]", "[2, 4, 1]"), "recipe.yaml:5:23 source.inputs.x.shape: 3 dims given, the model's input has rank 2"),
    (("dtype: float32", "dtype: int8"), "recipe.yaml:5:38 source.inputs.x.dtype: the model takes float32"),
], ids=["name", "rank", "dtype"])
def test_run_refuses_inputs_that_do_not_match_the_model_before_building(project, cli, change, phrase):
    (project / "recipe.yaml").write_text(RECIPE.replace(*change))
    code, _, err = cli("run", "recipe.yaml")
    assert_usage_error(code, err, phrase)
    assert_nothing_built(project)


def test_model_inputs_are_read_without_loading_weights(tmp_path):
    """The wire-format reader agrees with onnx on names, dtypes and dims, and skips initializers' bytes."""
    from edgebuild.recipe.model_inputs import read_graph_inputs

    big = numpy_helper.from_array(np.zeros((256, 256), dtype=np.float32), "big")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "big"], ["c"]), helper.make_node("Cast", ["ids"], ["d"], to=1)], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT16, ["batch", 256]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 128]),
         helper.make_tensor_value_info("big", TensorProto.FLOAT, [256, 256])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT16, None),
         helper.make_tensor_value_info("d", TensorProto.FLOAT, None)], [big])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "g.onnx")
    inputs = {i.name: i for i in read_graph_inputs(tmp_path / "g.onnx")}
    assert list(inputs) == ["a", "ids", "big"]
    assert (inputs["a"].dtype, inputs["a"].dims, inputs["a"].initializer) == ("float16", ["batch", 256], False)
    assert (inputs["ids"].dtype, inputs["ids"].dims) == ("int64", [1, 128])
    assert inputs["big"].initializer


# --- verify ------------------------------------------------------------------------------------


@pytest.fixture
def artifact(tmp_path):
    """What the test plugin's runtime claims (a folder holding model.onnx); arguments are checked before it runs."""
    path = tmp_path / "model"
    path.mkdir()
    write_model(path / "model.onnx")
    return path


@pytest.mark.parametrize("reference, phrase", [
    ("missing.onnx", "--reference missing.onnx: no such file"),
    ("adir", "is a directory; give the source .onnx model"),
    ("notes.txt", "not an ONNX model"),
    ("empty.onnx", "not an ONNX model (empty file)"),
])
def test_verify_reference_that_is_not_a_model(tmp_path, monkeypatch, cli, artifact, reference, phrase):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "adir").mkdir()
    (tmp_path / "notes.txt").write_text("just some notes\n")
    (tmp_path / "empty.onnx").write_bytes(b"")
    code, _, err = cli("verify", artifact, "--reference", reference)
    assert_usage_error(code, err, phrase)


@pytest.mark.parametrize("args", [["--cosine-min", "1.5"], ["--cosine-min", "nan"], ["--max-abs-max", "-1"],
                                  ["--samples", "0"], ["--samples", "100000000"]])
def test_verify_thresholds_out_of_their_domain(tmp_path, cli, artifact, args):
    write_model(tmp_path / "m.onnx")
    code, _, err = cli("verify", artifact, "--reference", tmp_path / "m.onnx", *args)
    assert_usage_error(code, err, args[0])


class _Runtime(Runtime):
    """A runtime as far as the reference check sees one: the inputs its artifact takes."""

    def __init__(self, names):
        self.names = names

    def input_names(self, artifact):
        return self.names


def test_verify_reference_that_does_not_match_the_artifact(tmp_path):
    from edgebuild.cli.arguments import check_reference
    from edgebuild.errors import UsageError

    reference = write_model(tmp_path / "m.onnx", input_name="input.1")
    check_reference(reference, tmp_path / "a", _Runtime(["input.1"]))
    check_reference(reference, tmp_path / "a", _Runtime(["input_1"]))  # a backend's spelling of the same name
    with pytest.raises(UsageError, match="the artifact takes input\\(s\\) 'pixels', which the reference model does not have"):
        check_reference(reference, tmp_path / "a", _Runtime(["pixels"]))


def test_verify_reference_mismatch_with_a_real_artifact(project):
    """Build an artifact, then verify it against a model with other inputs (subprocess, as a user)."""
    run = subprocess.run([sys.executable, "-m", "edgebuild.cli.app", "run", "recipe.yaml"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    write_model(project / "other.onnx", input_name="z")
    done = subprocess.run([sys.executable, "-m", "edgebuild.cli.app", "verify", "out/default/model",
                           "--reference", "other.onnx"], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "does not match" in done.stderr and "'x'" in done.stderr
