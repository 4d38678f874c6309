"""Weight files shared between stage outputs: the optimise stage links the import stage's, reads
it back through load_stage_model, and the store does not hash what a stage vouched for."""

from __future__ import annotations

import os
import stat

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgebuild.errors import BuildError
from edgebuild.graph.frontend import OnnxFrontend
from edgebuild.graph.optimize import optimize
from edgebuild.graph.weight_files import load_stage_model
from edgebuild.store import hashstate
from edgebuild.store.local import scan
from edgebuild_testplugin.models import no_passes, point_external_data

RNG = np.random.default_rng(3)


def _gather_matmul_model(path):
    """An embedding table and a head, external: passes leave both weights as they are."""
    table = numpy_helper.from_array(RNG.standard_normal((64, 32)).astype(np.float32), "table")
    head = numpy_helper.from_array(RNG.standard_normal((32, 48)).astype(np.float32), "head")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["h"]), helper.make_node("MatMul", ["h", "head"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 48])], [table, head])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True)
    onnx.save_model(model, str(path), save_as_external_data=True, location="w.bin", size_threshold=0)
    return path


def _run(path, feeds):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_optimise_links_the_import_weight_file_and_reads_back_through_it(tmp_path):
    src = _gather_matmul_model(tmp_path / "src" / "m.onnx")
    OnnxFrontend().import_model(src, {}, tmp_path / "imp")
    optimize(tmp_path / "imp" / "model.onnx", tmp_path / "opt", passes=no_passes())
    imported, optimised = tmp_path / "imp" / "model.onnx.data", tmp_path / "opt" / "model.onnx.data"
    assert os.path.samefile(imported, optimised) and os.stat(optimised).st_nlink == 2
    assert not os.stat(imported).st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)  # sealed first
    with pytest.raises(Exception, match="hard link"):  # why stages read it with load_stage_model
        onnx.load(str(tmp_path / "opt" / "model.onnx"))
    model = load_stage_model(tmp_path / "opt" / "model.onnx")
    weights = {v.name: v.const_value.numpy() for v in model.graph.initializers.values()}
    source = onnx.load(str(src))
    for tensor in source.graph.initializer:
        np.testing.assert_array_equal(weights[tensor.name], numpy_helper.to_array(tensor))
    ids = RNG.integers(0, 64, (2, 3))
    np.testing.assert_allclose(_run(tmp_path / "opt" / "model.onnx", {"ids": ids}), _run(src, {"ids": ids}),
                               rtol=1e-6)


def test_load_stage_model_refuses_data_outside_its_folder(tmp_path):
    src = _gather_matmul_model(tmp_path / "inner" / "m.onnx")
    point_external_data(src, "../outside.bin")
    (tmp_path / "outside.bin").write_bytes((src.parent / "w.bin").read_bytes())
    with pytest.raises(BuildError, match="outside the model's directory"):
        load_stage_model(src)


def test_linked_and_copied_weight_files_are_not_hashed_again(tmp_path, monkeypatch):
    hashstate.configure(None)
    src = _gather_matmul_model(tmp_path / "src" / "m.onnx")
    OnnxFrontend().import_model(src, {}, tmp_path / "imp")
    reads = []
    real = hashstate.sha256_of
    monkeypatch.setattr(hashstate, "sha256_of", lambda p: reads.append(os.path.basename(p)) or real(p))
    imported = scan(tmp_path / "imp")  # the copy was vouched for with the source's digest
    optimize(tmp_path / "imp" / "model.onnx", tmp_path / "opt", passes=no_passes())
    optimised = scan(tmp_path / "opt")  # the link keeps the import's digest
    assert "model.onnx.data" not in reads
    assert imported["model.onnx.data"]["sha256"] == optimised["model.onnx.data"]["sha256"] == real(tmp_path / "opt" / "model.onnx.data")
    hashstate.configure(None)


def test_a_copy_made_ahead_is_vouched_and_one_left_early_is_removed(tmp_path, monkeypatch):
    import threading

    from edgebuild.graph.weight_files import copying
    from edgebuild.store import links

    source = tmp_path / "weights.bin"
    source.write_bytes(os.urandom(3 * 4096 + 5))
    hashstate.configure(None)  # what this process vouched for is remembered in memory
    monkeypatch.setattr(links, "FICLONE", -1)  # no reflink here: the chunked kernel copy
    monkeypatch.setattr(links, "COPY_CHUNK", 4096)
    with copying(source, tmp_path / "copy.bin") as wait:
        wait()
    assert (tmp_path / "copy.bin").read_bytes() == source.read_bytes()
    assert hashstate.known_sha256(tmp_path / "copy.bin") == hashstate.file_sha256(source)

    with pytest.raises(KeyError), copying(source, tmp_path / "left.bin"):
        raise KeyError("the export failed")
    assert not (tmp_path / "left.bin").exists()

    stop = threading.Event()
    stop.set()
    assert links.clone_or_copy(source, tmp_path / "stopped.bin", stop) is False
    assert (tmp_path / "stopped.bin").stat().st_size < source.stat().st_size
    hashstate.configure(None)
