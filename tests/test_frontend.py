"""The ONNX frontend (import stage) and the optimise stage on small generated models."""

from __future__ import annotations

import gc
import os
import weakref
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgebuild.errors import BuildError
from edgebuild.graph.frontend import OnnxFrontend
from edgebuild.graph.optimize import optimize

F = TensorProto.FLOAT
RNG = np.random.default_rng(1)


def vi(name, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def save(model: onnx.ModelProto, path: Path, external: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=external, size_threshold=0)
    else:
        onnx.save_model(model, str(path))
    return path


def linear_model(opset=13, batch="N", out=3) -> onnx.ModelProto:
    w = numpy_helper.from_array(RNG.standard_normal((4, out)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [vi("x", [batch, 4])], [vi("y", [batch, out])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def run_ort(path_or_model, feeds):
    source = str(path_or_model) if isinstance(path_or_model, Path) else path_or_model.SerializeToString()
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


# ---- external data ------------------------------------------------------------------------


def set_location(model: onnx.ModelProto, tensor: str, **fields) -> None:
    init = next(t for t in model.graph.initializer if t.name == tensor)
    for entry in init.external_data:
        if entry.key in fields:
            entry.value = str(fields.pop(entry.key))
    for key, value in fields.items():
        init.external_data.add(key=key, value=str(value))


def test_import_writes_model_and_external_weights(tmp_path):
    src = save(linear_model(out=32), tmp_path / "src" / "m.onnx", external="m.bin")
    report = OnnxFrontend().import_model(src, {"x": {"shape": [2, 4], "dtype": "float32"}}, tmp_path / "out")
    assert (tmp_path / "out" / "model.onnx.data").stat().st_size == 4 * 32 * 4
    assert report["weight_bytes"] == 4 * 32 * 4 and report["initializers"] == 1 and report["nodes"] == 1
    assert report["weight_dtypes"] == {"float32": 4 * 32 * 4}  # what the report compares compressed sizes with
    assert report["inputs"] == {"x": {"shape": [2, 4], "dtype": "float32"}}
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(run_ort(tmp_path / "out" / "model.onnx", {"x": x})[0],
                               run_ort(src, {"x": x})[0], rtol=1e-6)
    proto = onnx.load(str(tmp_path / "out" / "model.onnx"), load_external_data=False)
    assert proto.graph.initializer[0].data_location == TensorProto.EXTERNAL


def test_external_data_escaping_the_model_directory_raises(tmp_path):
    model = linear_model()
    src = save(model, tmp_path / "src" / "m.onnx", external="m.bin")
    (tmp_path / "escape.bin").write_bytes(b"\0" * 64)
    proto = onnx.load(str(src), load_external_data=False)
    set_location(proto, "w", location="../escape.bin")
    onnx.save_model(proto, str(src))
    with pytest.raises(BuildError, match=r"'w'.*\.\./escape\.bin.*outside"):
        OnnxFrontend().import_model(src, {}, tmp_path / "out")


def test_truncated_external_data_raises(tmp_path):
    src = save(linear_model(), tmp_path / "src" / "m.onnx", external="m.bin")
    data = tmp_path / "src" / "m.bin"
    data.write_bytes(data.read_bytes()[:20])
    with pytest.raises(BuildError, match=r"'w'.*m\.bin.*holds only 20 bytes"):
        OnnxFrontend().import_model(src, {}, tmp_path / "out")


@pytest.mark.skipif(os.name == "nt", reason="symlinks")
def test_symlink_out_of_the_model_directory_raises(tmp_path):
    src = save(linear_model(), tmp_path / "src" / "m.onnx", external="m.bin")
    outside = tmp_path / "elsewhere.bin"
    (tmp_path / "src" / "m.bin").rename(outside)
    (tmp_path / "src" / "m.bin").symlink_to(outside)
    with pytest.raises(BuildError, match="outside"):
        OnnxFrontend().import_model(src, {}, tmp_path / "out")


# ---- single-file models: weights mapped from the .onnx file ----------------------------------


def single_file_model() -> onnx.ModelProto:
    """Weights of every kind a single-file export holds: raw_data, packed float_data (a
    Constant node), varint int64_data, a small tensor and one inside an If branch."""
    w = numpy_helper.from_array(RNG.standard_normal((16, 32)).astype(np.float32), "w")  # raw_data
    c = helper.make_tensor("c", F, [300], RNG.standard_normal(300).astype(np.float32).tolist())  # float_data
    idx = helper.make_tensor("idx", TensorProto.INT64, [300], list(range(300)))  # int64_data
    small = numpy_helper.from_array(np.float32([2.0]), "small")
    inner = numpy_helper.from_array(RNG.standard_normal(400).astype(np.float32), "inner")
    branch = helper.make_graph([helper.make_node("Identity", ["inner"], ["b"])], "branch", [], [vi("b", [400])],
                               [inner])
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Mul", ["h", "small"], ["y"]),
        helper.make_node("Constant", [], ["cv"], value=c),
        helper.make_node("Gather", ["cv", "idx"], ["z"]),
        helper.make_node("If", ["cond"], ["bo"], then_branch=branch, else_branch=branch),
    ]
    graph = helper.make_graph(nodes, "g", [vi("x", [2, 16]), vi("cond", [], TensorProto.BOOL)],
                              [vi("y", [2, 32]), vi("z", [300]), vi("bo", [400])], [w, idx, small])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_streamed_load_maps_embedded_weights_from_the_model_file(tmp_path):
    from edgebuild.graph.onnx_stream import load_streamed

    src = save(single_file_model(), tmp_path / "m.onnx")
    streamed, parsed = load_streamed(src), ir.load(src)
    tensors = {v.name: v.const_value for v in streamed.graph.initializers.values()}
    tensors["c"] = next(n for n in streamed.graph if n.op_type == "Constant").attributes["value"].value
    expected = {v.name: v.const_value for v in parsed.graph.initializers.values()}
    expected["c"] = next(n for n in parsed.graph if n.op_type == "Constant").attributes["value"].value
    for name, tensor in tensors.items():
        assert tensor.dtype == expected[name].dtype and tensor.shape == expected[name].shape
        np.testing.assert_array_equal(tensor.numpy(), expected[name].numpy(), err_msg=name)
    mapped = {name for name, tensor in tensors.items() if isinstance(tensor, ir.ExternalTensor)}
    assert mapped == {"w", "c"}  # raw_data and packed float_data; varint ints and small ones stay
    assert {str(tensors[name].location) for name in mapped} == {"m.onnx"}
    # the If branch keeps its own weight, parsed as usual
    [if_node] = [n for n in streamed.graph if n.op_type == "If"]
    inner = if_node.attributes["then_branch"].value.initializers["inner"].const_value
    assert not isinstance(inner, ir.ExternalTensor) and inner.numpy().shape == (400,)


def test_single_file_model_imports_to_the_same_outputs(tmp_path):
    src = save(single_file_model(), tmp_path / "src" / "m.onnx")
    report = OnnxFrontend().import_model(src, {}, tmp_path / "out")
    assert (tmp_path / "out" / "model.onnx.data").stat().st_size >= (16 * 32 + 300) * 4
    assert report["initializers"] == 6  # w, idx, small, the lifted constant, and each branch's
    feeds = {"x": RNG.standard_normal((2, 16)).astype(np.float32), "cond": np.array(True)}
    for got, want in zip(run_ort(tmp_path / "out" / "model.onnx", feeds), run_ort(src, feeds)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_unreadable_single_file_model_is_a_build_error(tmp_path, damage):
    src = save(single_file_model(), tmp_path / "m.onnx")
    data = src.read_bytes()
    src.write_bytes(b"\xff" * 64 if damage == "garbage" else data[: len(data) // 2])
    with pytest.raises(BuildError, match=r"m\.onnx: not a readable ONNX model"):
        OnnxFrontend().import_model(src, {}, tmp_path / "out")
    assert not (tmp_path / "out" / "model.onnx").exists()


# ---- constants, shapes, fixed inputs ---------------------------------------------------------


def test_constant_nodes_become_initializers(tmp_path):
    nodes = [
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.full((2,), 3, np.float32))),
        helper.make_node("Add", ["x", "c"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [vi("x", [2])], [vi("y", [2])])
    src = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "m.onnx")
    report = OnnxFrontend().import_model(src, {}, tmp_path / "out")
    out = ir.load(tmp_path / "out" / "model.onnx")
    assert [n.op_type for n in out.graph] == ["Add"]
    np.testing.assert_array_equal(out.graph.initializers["c"].const_value.numpy(), [3, 3])
    assert report["nodes"] == 1 and report["initializers"] == 1


def test_static_dims_are_pinned_and_flexible_dims_stay_symbolic(tmp_path):
    src = save(linear_model(batch="batch"), tmp_path / "m.onnx")
    OnnxFrontend().import_model(src, {"x": {"shape": [8, 4]}}, tmp_path / "a")
    assert list(ir.load(tmp_path / "a" / "model.onnx").graph.inputs[0].shape) == [8, 4]
    report = OnnxFrontend().import_model(src, {"x": {"shape": [{"range": [1, 16]}, 4]}}, tmp_path / "b")
    dims = ir.load(tmp_path / "b" / "model.onnx").graph.inputs[0].shape
    assert dims[0].value == "batch" and dims[1] == 4
    assert report["inputs"]["x"]["shape"] == ["batch", 4]


@pytest.mark.parametrize("spec,message", [
    ({"x": {"shape": [2, 5]}}, "fixed to 4"),
    ({"x": {"shape": [2]}}, "rank 2"),
    ({"x": {"shape": [2, 4], "dtype": "int64"}}, "dtype int64"),
    ({"nope": {"shape": [1]}}, "'nope'.*does not have"),
])
def test_recipe_inputs_that_contradict_the_model_raise(tmp_path, spec, message):
    src = save(linear_model(), tmp_path / "m.onnx")
    with pytest.raises(BuildError, match=message):
        OnnxFrontend().import_model(src, spec, tmp_path / "out")


def if_on_sample_rate_model() -> onnx.ModelProto:
    """A silero-vad-like graph: one weight per sample-rate branch, chosen by an ``If``."""
    w16 = numpy_helper.from_array(np.full((4, 4), 2.0, np.float32), "w16")
    w8 = numpy_helper.from_array(np.full((4, 4), 3.0, np.float32), "w8")
    then_g = helper.make_graph([helper.make_node("MatMul", ["x", "w16"], ["t_out"])], "then", [], [vi("t_out", [1, 4])])
    else_g = helper.make_graph([helper.make_node("MatMul", ["x", "w8"], ["e_out"])], "else", [], [vi("e_out", [1, 4])])
    nodes = [
        helper.make_node("Constant", [], ["k16"], value=numpy_helper.from_array(np.array(16000, np.int64))),
        helper.make_node("Equal", ["sr", "k16"], ["is16"]),
        helper.make_node("If", ["is16"], ["y"], then_branch=then_g, else_branch=else_g),
    ]
    graph = helper.make_graph(nodes, "g", [vi("x", [1, 4]), vi("sr", [], TensorProto.INT64)], [vi("y", [1, 4])],
                              [w16, w8])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    model.ir_version = 8
    return model


def test_fixed_input_folds_the_if_and_drops_the_dead_branch(tmp_path):
    src = save(if_on_sample_rate_model(), tmp_path / "src" / "m.onnx", external="m.bin")
    x = RNG.standard_normal((1, 4)).astype(np.float32)
    expected = run_ort(src, {"x": x, "sr": np.array(16000, np.int64)})[0]

    report = OnnxFrontend().import_model(src, {"sr": {"value": 16000, "dtype": "int64"}}, tmp_path / "imp")
    assert list(report["inputs"]) == ["x"]
    assert any("'sr' fixed" in note for note in report["notes"])
    opt = optimize(tmp_path / "imp" / "model.onnx", tmp_path / "opt", passes={}, registry=_no_passes())
    assert "If" in opt["op_counts_before"] and "If" not in opt["op_counts_after"]
    out = ir.load(tmp_path / "opt" / "model.onnx")
    assert [n.op_type for n in out.graph] == ["MatMul"]
    assert set(out.graph.initializers) == {"w16"}  # the 8 kHz branch's weight is gone
    np.testing.assert_allclose(run_ort(tmp_path / "opt" / "model.onnx", {"x": x})[0], expected, rtol=1e-6)


def _no_passes():
    class Empty:
        tables = {"passes": {}}

    return Empty()


# ---- opset upgrade ----------------------------------------------------------------------------


def test_opset_11_model_is_upgraded_to_13(tmp_path):
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], axes=[1], keepdims=1),
             helper.make_node("Clip", ["s", "lo", "hi"], ["y"])]
    inits = [numpy_helper.from_array(np.float32(-1.0), "lo"), numpy_helper.from_array(np.float32(1.0), "hi")]
    graph = helper.make_graph(nodes, "g", [vi("x", [2, 3])], [vi("y", [2, 1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 6
    src = save(model, tmp_path / "m.onnx")
    report = OnnxFrontend().import_model(src, {}, tmp_path / "out")
    assert report["opset"] == 13
    assert any("upgraded from 11 to 13" in n for n in report["notes"])
    out = onnx.load(str(tmp_path / "out" / "model.onnx"))
    reduce = next(n for n in out.graph.node if n.op_type == "ReduceSum")
    assert len(reduce.input) == 2  # opset 13 moved axes to an input
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(run_ort(tmp_path / "out" / "model.onnx", {"x": x})[0],
                               run_ort(src, {"x": x})[0], rtol=1e-6)



def test_old_opset_single_file_model_with_large_constants_is_upgraded(tmp_path):
    """Constant values mapped from the .onnx file survive the opset converter's round trip."""
    weight = RNG.standard_normal((3, 512)).astype(np.float32)
    nodes = [helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(weight)),
             helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("ReduceSum", ["h"], ["y"], axes=[1], keepdims=1)]
    graph = helper.make_graph(nodes, "g", [vi("x", [2, 3])], [vi("y", [2, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 6
    src = save(model, tmp_path / "src" / "m.onnx")
    report = OnnxFrontend().import_model(src, {}, tmp_path / "out")
    assert report["opset"] == 13
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(run_ort(tmp_path / "out" / "model.onnx", {"x": x})[0],
                               run_ort(src, {"x": x})[0], rtol=1e-6)

# ---- the optimise stage with the registered passes -------------------------------------------


def _linear_silu_model(tmp_path) -> Path:
    d = 8
    inits = [numpy_helper.from_array(RNG.standard_normal((d, d)).astype(np.float32), "w"),
             numpy_helper.from_array(RNG.standard_normal(d).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["h"]),
             helper.make_node("Sigmoid", ["h"], ["s"]), helper.make_node("Mul", ["h", "s"], ["y"])]
    graph = helper.make_graph(nodes, "g", [vi("x", [2, d])], [vi("y", [2, d])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return save(model, tmp_path / "m.onnx")


def test_optimize_runs_registered_passes_and_reports_counts(tmp_path):
    src = _linear_silu_model(tmp_path)
    OnnxFrontend().import_model(src, {}, tmp_path / "imp")
    report = optimize(tmp_path / "imp" / "model.onnx", tmp_path / "opt", passes={"fuse_attention": False})
    assert report["nodes_before"] == 4 and report["nodes_after"] == 2
    assert report["op_counts_after"] == {"edgebuild::Linear": 1, "edgebuild::Silu": 1}
    assert report["rules"]["fuse_bias"] >= 1 and report["rules"]["fuse_activations"] == 1
    assert "fuse_attention" not in report["rules"]

    from edgebuild.graph.fused_reference import run_reference

    x = RNG.standard_normal((2, 8)).astype(np.float32)
    got = run_reference(tmp_path / "opt" / "model.onnx", {"x": x})["y"]
    np.testing.assert_allclose(got, run_ort(src, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_optimize_lets_go_of_the_model(tmp_path, monkeypatch):
    """Rewrite rules outlive a build: a matcher still holding the last graph would keep its
    weights resident through the lowering that follows in the same process."""
    OnnxFrontend().import_model(_linear_silu_model(tmp_path), {}, tmp_path / "imp")
    loaded, real_load = [], ir.load

    def load(path, *args, **kwargs):
        model = real_load(path, *args, **kwargs)
        loaded.append(weakref.ref(model.graph))
        return model

    monkeypatch.setattr(ir, "load", load)
    optimize(tmp_path / "imp" / "model.onnx", tmp_path / "opt")
    gc.collect()
    assert loaded and all(ref() is None for ref in loaded)


def test_int8_weights_stay_int8_through_optimize(tmp_path):
    wq = RNG.integers(-100, 100, (6, 4)).astype(np.int8)
    inits = [numpy_helper.from_array(wq, "wq"), numpy_helper.from_array(np.float32(0.05), "scale")]
    nodes = [helper.make_node("Cast", ["wq"], ["wf"], to=F), helper.make_node("Mul", ["wf", "scale"], ["w"]),
             helper.make_node("MatMul", ["x", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [vi("x", [3, 6])], [vi("y", [3, 4])], inits)
    src = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "m.onnx")
    OnnxFrontend().import_model(src, {}, tmp_path / "imp")
    report = optimize(tmp_path / "imp" / "model.onnx", tmp_path / "opt")
    assert report["rules"]["dequantize_weights"] == 1
    assert report["op_counts_after"].get("DequantizeLinear") == 1
    out = ir.load(tmp_path / "opt" / "model.onnx")
    assert {v.const_value.dtype for v in out.graph.initializers.values()} >= {ir.DataType.INT8}
    assert all(v.const_value.dtype != ir.DataType.FLOAT or v.const_value.size < 24
               for v in out.graph.initializers.values())


# ---- a real model, when one is available ------------------------------------------------------


def _real_model(name: str) -> Path:
    root = os.environ.get("EDGEBUILD_TEST_MODELS")
    if not root:
        pytest.skip("EDGEBUILD_TEST_MODELS is not set")
    hits = sorted(Path(root).rglob(f"*{name}*/**/*.onnx")) + sorted(Path(root).rglob(f"*{name}*.onnx"))
    if not hits:
        pytest.skip(f"no {name} ONNX model under EDGEBUILD_TEST_MODELS")
    return hits[0]


@pytest.mark.slow
def test_paraphrase_minilm_fuses_layer_norm_gelu_and_attention(tmp_path):
    src = _real_model("paraphrase-MiniLM")
    model = onnx.load(str(src), load_external_data=False)
    inputs = {i.name: {"shape": [1, 16]} for i in model.graph.input}
    OnnxFrontend().import_model(src, inputs, tmp_path / "imp")
    report = optimize(tmp_path / "imp" / "model.onnx", tmp_path / "opt")
    before, after = report["op_counts_before"], report["op_counts_after"]
    layers = before["Softmax"]  # one attention block per layer
    assert after.get("edgebuild::ScaledDotProductAttention") == layers and "Softmax" not in after
    assert after.get("edgebuild::Gelu") == before["Erf"] == layers and "Erf" not in after
    assert after.get("LayerNormalization", 0) == 2 * layers + 1
    assert after.get("edgebuild::Linear", 0) >= 6 * layers

    from edgebuild.graph.fused_reference import run_reference

    feeds = {}
    for i in model.graph.input:
        feeds[i.name] = (np.ones((1, 16), np.int64) if "mask" in i.name else
                         np.zeros((1, 16), np.int64) if "type" in i.name else
                         RNG.integers(100, 1000, (1, 16)).astype(np.int64))
    expected = dict(zip([o.name for o in model.graph.output], run_ort(src, feeds)))
    got = run_reference(tmp_path / "opt" / "model.onnx", feeds)
    floats = [name for name, value in expected.items() if value.dtype == np.float32]
    assert floats
    for name in floats:  # the embeddings; the int outputs are pass-through ids
        e, g = expected[name].ravel(), got[name].ravel()
        assert float(np.dot(e, g) / np.linalg.norm(e) / np.linalg.norm(g)) > 0.9999
        np.testing.assert_allclose(g, e, atol=1e-3)
