"""A source's external data is part of its content, and a large one is referred to, not copied.

Editing only an ONNX model's weight file (a re-export after more training leaves the graph file
byte for byte the same) must rebuild; the import stage's entry holds a large weight file as a
symbolic link to the source's instead of a copy, the optimise stage's repeats it, and the user's
file is never sealed, linked or changed. An entry whose referred file changed is not served."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgebuild.graph.frontend import OnnxFrontend
from edgebuild.graph.optimize import optimize
from edgebuild.graph.source_files import external_data_files
from edgebuild.graph.weight_files import load_stage_model
from edgebuild.store import links
from edgebuild_testplugin.cli_runner import assert_usage_error, edgebuild
from edgebuild_testplugin.models import no_passes, point_external_data

RNG = np.random.default_rng(11)
RECIPE = """\
edgebuild: 1
name: ext
source:
  model: src/m.onnx
  inputs: {x: {shape: [2, 32], dtype: float32}}
target: {backend: testcopy, precision: float32}
outputs: {dir: out}
"""


def _write_model(path: Path, scale: float = 1.0) -> Path:
    """x @ W + b with both initializers in one external file."""
    weight = numpy_helper.from_array((RNG.standard_normal((32, 48)) * scale).astype(np.float32), "W")
    bias = numpy_helper.from_array((RNG.standard_normal(48) * scale).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 48])], [weight, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path), save_as_external_data=True, location="w.bin", size_threshold=0)
    return path


def _weights(model) -> dict[str, np.ndarray]:
    return {v.name: v.const_value.numpy() for v in model.graph.initializers.values()}


@pytest.fixture
def refer_every_size(monkeypatch):
    monkeypatch.setattr(links, "REFERENCE_MIN_BYTES", 0)


def test_external_data_files_are_found_by_scan_then_parse(tmp_path):
    model = _write_model(tmp_path / "m.onnx")
    assert external_data_files(model) == [tmp_path / "w.bin"]
    inline = tmp_path / "inline.onnx"
    onnx.save_model(onnx.load(str(model)), str(inline))  # weights inside the proto
    assert external_data_files(inline) == []
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert external_data_files(tmp_path / "empty.onnx") == []
    (tmp_path / "junk.onnx").write_bytes(b"\x0a\x08location not a model")
    assert external_data_files(tmp_path / "junk.onnx") == []  # the import names the broken file


def test_data_outside_the_folder_is_not_a_source_file(tmp_path):
    model = point_external_data(_write_model(tmp_path / "inner" / "m.onnx"), "../w.bin")
    os.replace(tmp_path / "inner" / "w.bin", tmp_path / "w.bin")
    assert external_data_files(model) == []  # the import refuses it, naming the tensor


def test_a_large_weight_file_is_referred_to_through_import_and_optimise(tmp_path, refer_every_size):
    src = _write_model(tmp_path / "src" / "m.onnx")
    data = src.parent / "w.bin"
    before = os.stat(data)
    OnnxFrontend().import_model(src, {}, tmp_path / "imp")
    optimize(tmp_path / "imp" / "model.onnx", tmp_path / "opt", passes=no_passes())
    for stage in ("imp", "opt"):
        held = tmp_path / stage / "model.onnx.data"
        assert held.is_symlink() and os.readlink(held) == os.path.realpath(data)
    after = os.stat(data)  # the user's file: not sealed, not linked, not written
    assert (after.st_mode, after.st_nlink, after.st_mtime_ns, after.st_ctime_ns) == \
        (before.st_mode, 1, before.st_mtime_ns, before.st_ctime_ns)
    assert stat.S_IMODE(after.st_mode) & stat.S_IWUSR
    model = load_stage_model(tmp_path / "opt" / "model.onnx")
    source = onnx.load(str(src))
    for tensor in source.graph.initializer:
        np.testing.assert_array_equal(_weights(model)[tensor.name], numpy_helper.to_array(tensor))


def test_a_small_weight_file_is_still_copied(tmp_path):
    src = _write_model(tmp_path / "src" / "m.onnx")
    OnnxFrontend().import_model(src, {}, tmp_path / "imp")
    held = tmp_path / "imp" / "model.onnx.data"
    assert not held.is_symlink() and held.read_bytes() == (src.parent / "w.bin").read_bytes()


def test_a_reference_from_a_stage_may_point_outside_a_link_in_a_folder_may_not(tmp_path, refer_every_size):
    from edgebuild.errors import BuildError

    src = _write_model(tmp_path / "src" / "m.onnx")
    OnnxFrontend().import_model(src, {}, tmp_path / "imp")
    load_stage_model(tmp_path / "imp" / "model.onnx")  # the entry's own reference: fine
    (tmp_path / "hostile").mkdir()
    os.symlink(src.parent, tmp_path / "hostile" / "sub")  # a folder link leading out
    point_external_data(tmp_path / "imp" / "model.onnx", "sub/w.bin", save_to=tmp_path / "hostile" / "model.onnx")
    with pytest.raises(BuildError, match="outside the model's directory"):
        load_stage_model(tmp_path / "hostile" / "model.onnx")


def _statuses(out: str) -> dict[str, str]:
    (variant,) = json.loads(out)["variants"]
    return {s["name"]: s["status"] for s in variant["stages"]}


@pytest.fixture
def ext_project(tmp_path, monkeypatch):
    _write_model(tmp_path / "src" / "m.onnx")
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EDGEBUILD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("EDGEBUILD_TEST_LOG", str(tmp_path / "log.txt"))
    return tmp_path


def _stage_data(root: Path, out: str, stage: str) -> bytes:
    """The bytes of ``stage``'s entry's weight file, in the run whose ``--json`` is ``out``."""
    from edgebuild.store.location import open_store

    key = next(s["key"] for s in json.loads(out)["variants"][0]["stages"] if s["name"] == stage)
    return (open_store(root / "cache").lookup(key).out / "model.onnx.data").read_bytes()


def _rewrite_weights(root: Path) -> bytes:
    """New weights, same graph file and same data file size: what a re-export after training does."""
    data = root / "src" / "w.bin"
    new = RNG.standard_normal(data.stat().st_size // 4).astype(np.float32).tobytes()
    with open(data, "r+b") as file:
        file.write(new)
    return new


def test_editing_only_the_weight_file_rebuilds(ext_project):
    graph = (ext_project / "src" / "m.onnx").read_bytes()
    assert _statuses(edgebuild("run", "recipe.yaml", "--json", check=0).stdout)["import"] == "ran"
    assert _statuses(edgebuild("run", "recipe.yaml", "--json", check=0).stdout)["import"] == "cached"
    new = _rewrite_weights(ext_project)
    assert (ext_project / "src" / "m.onnx").read_bytes() == graph
    done = edgebuild("run", "recipe.yaml", "--json", check=0).stdout
    assert _statuses(done)["import"] == _statuses(done)["lower"] == "ran"
    assert _stage_data(ext_project, done, "optimize") == new
    edgebuild("run", "recipe.yaml", "--depfile", "deps.d", check=0)
    assert os.path.join("src", "w.bin") in (ext_project / "deps.d").read_text()  # a prerequisite too


def test_entries_referring_to_an_edited_file_are_not_served(ext_project, cli, refer_every_size):
    from edgebuild.store.location import open_store

    code, out, err = cli("run", "recipe.yaml", "--json")
    assert code == 0, err
    keys = {s["name"]: s["key"] for s in json.loads(out)["variants"][0]["stages"]}
    store = open_store(ext_project / "cache")
    for stage in ("import", "optimize"):
        assert (store.lookup(keys[stage]).out / "model.onnx.data").is_symlink()
    new = _rewrite_weights(ext_project)
    assert store.lookup(keys["import"]) is None  # its file's digest changed: evicted, not served
    assert (ext_project / "src" / "w.bin").read_bytes() == new  # and eviction left the user's file
    code, out, err = cli("run", "recipe.yaml", "--json")
    assert code == 0, err
    assert _statuses(out)["import"] == "ran" and _stage_data(ext_project, out, "optimize") == new
    code, _, err = cli("cache", "clear")
    assert code == 0, err
    assert (ext_project / "src" / "w.bin").read_bytes() == new


def test_an_unreadable_weight_file_is_a_clear_error(ext_project, cli, monkeypatch):
    from edgebuild.store import hashstate

    real = hashstate.file_sha256

    def refuse(path, *args, **kwargs):
        if Path(path).name == "w.bin":
            raise PermissionError(13, "Permission denied")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(hashstate, "file_sha256", refuse)
    code, _, err = cli("run", "recipe.yaml")
    assert_usage_error(code, err, "w.bin", "m.onnx names cannot be read (Permission denied)", "permissions")
    assert not (ext_project / "out").exists()


@pytest.mark.parametrize("at", [0, 5, 6, 7, 8, 9, 15])
def test_the_scan_finds_the_key_across_read_boundaries(tmp_path, at):
    from edgebuild.graph.source_files import _holds

    data = bytearray(b"x" * 40)
    data[at:at + 4] = b"KEY!"
    (tmp_path / "f").write_bytes(bytes(data))
    assert _holds(tmp_path / "f", b"KEY!", chunk=8)
    assert not _holds(tmp_path / "f", b"KEY?", chunk=8)


def test_an_upgraded_models_scratch_weights_are_copied_not_referred_to(tmp_path, refer_every_size):
    """An opset-11 model is converted with its weights written to a scratch folder inside the
    entry, removed once saved: the entry must hold a copy of them, not a link that would dangle."""
    src = _write_model(tmp_path / "src" / "m.onnx")
    proto = onnx.load(str(src))
    proto.opset_import[0].version = 11
    onnx.save_model(proto, str(src), save_as_external_data=True, location="w.bin", size_threshold=0)
    report = OnnxFrontend().import_model(src, {}, tmp_path / "imp")
    assert any("opset upgraded" in note for note in report.get("notes", [])), report
    held = tmp_path / "imp" / "model.onnx.data"
    assert held.is_file() and not held.is_symlink()
    model = load_stage_model(tmp_path / "imp" / "model.onnx")
    for tensor in onnx.load(str(src)).graph.initializer:
        np.testing.assert_array_equal(_weights(model)[tensor.name], numpy_helper.to_array(tensor))
