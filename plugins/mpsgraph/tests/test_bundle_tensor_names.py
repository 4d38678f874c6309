"""Bundle borders with names Core ML does not accept: recipes/example_ops.yaml's model (Core ML ->
Metal kernel -> Core ML) with its input, hand-offs and output renamed to a MIL reserved word, a
name starting with a digit and punctuation. The manifest keeps the ONNX names, each Core ML
segment's own name goes in ``binding``, and InferenceSession takes and returns the ONNX names."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
RENAMED = {"x": "input", "h4": "state", "normed": "1/normed:0", "y": "return/y:0"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    pytest.importorskip("edgebuild_example_ops")
    pytest.importorskip("edgebuild_coreml")
    import onnx_ir as ir
    from rich.console import Console

    from edgebuild.build.run import run_recipes

    work = tmp_path_factory.mktemp("bundle_names")
    model = ir.load(str(ROOT / "recipes" / "models" / "example_ops.onnx"))
    values = {v.name: v for node in model.graph for v in (*node.inputs, *node.outputs) if v is not None}
    for old, new in RENAMED.items():
        values[old].name = new
    model.graph.outputs.append(values["h4"])  # a hand-off that is also a graph output
    ir.save(model, work / "odd_names.onnx")
    recipe = yaml.safe_load((ROOT / "recipes" / "example_ops.yaml").read_text())
    recipe["source"] = {"model": "odd_names.onnx", "inputs": {"input": {"shape": [1, 8, 32], "dtype": "float32"}}}
    recipe["validate"]["inputs"] = {"input": recipe["validate"]["inputs"]["x"]}
    recipe["outputs"] = {"dir": "out"}
    (work / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    code = run_recipes([str(work / "recipe.yaml")], cache_dir=work / "cache", console=Console(stderr=True, quiet=True))
    assert code == 0
    return work, work / "out" / "default"


def test_manifest_keeps_onnx_names_and_binds_the_segments_own(built):
    _, out = built
    manifest = json.loads((out / "bundle" / "manifest.json").read_text())
    assert [s["backend"] for s in manifest["segments"]] == ["coreml", "msl", "coreml"]
    assert [t["name"] for t in manifest["inputs"]] == ["input"]
    assert sorted(t["name"] for t in manifest["outputs"]) == ["return/y:0", "state"]
    bindings = {(s["index"], t["name"]): t["binding"] for s in manifest["segments"] for t in (*s["inputs"], *s["outputs"])}
    assert bindings == {(0, "input"): None, (0, "state"): "state_", (1, "state"): None, (1, "1/normed:0"): None,
                        (2, "1/normed:0"): "v_1_normed_0", (2, "return/y:0"): "return_y_0"}
    assert {h["tensor"] for h in manifest["handoffs"]} == {"input", "state", "1/normed:0", "return/y:0"}


def test_inference_session_takes_and_returns_onnx_names(built, source_reference):
    from edgebuild.bundle.session import InferenceSession, compare_outputs

    work, out = built
    x = np.random.default_rng(7).uniform(-2, 2, size=(1, 8, 32)).astype(np.float32)
    got = InferenceSession(out, native=False).run({"input": x})  # the variant's folder: its lock file names the bundle
    want = source_reference(work / "odd_names.onnx")({"input": x})
    assert set(got) == set(want) == {"return/y:0", "state"}
    mse, max_diff = compare_outputs(got, want)
    assert mse < 1e-12 and max_diff < 1e-5


def test_report_lists_the_segment_renamings(built):
    _, out = built
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "built" and report["validation"]["failures"] == []
    assert sorted((r["segment"], r["tensor"], r["onnx"], r["artifact"]) for r in report["renamings"]) == [
        (0, "output", "state", "state_"), (2, "input", "1/normed:0", "v_1_normed_0"),
        (2, "output", "return/y:0", "return_y_0")]


def test_a_bundle_core_ml_runs_whole_keeps_onnx_names(tmp_path):
    """No custom op: the bundle is one model.mlpackage, whose metadata carries the renamings."""
    pytest.importorskip("edgebuild_coreml")
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from rich.console import Console

    from edgebuild.build.run import run_recipes
    from edgebuild.bundle.session import InferenceSession

    w = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4) / 10, "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["state", "w"], ["0/out"])], "one",
                              [helper.make_tensor_value_info("state", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("0/out", TensorProto.FLOAT, [1, 4])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), tmp_path / "one.onnx")
    (tmp_path / "one.yaml").write_text(yaml.safe_dump({
        "edgebuild": 1, "name": "one", "source": {"model": "one.onnx", "inputs": {"state": {"shape": [1, 4]}}},
        "target": {"backend": "bundle", "precision": "float32"}, "validate": {"samples": 2},
        "outputs": {"dir": "out"}}))
    code = run_recipes([str(tmp_path / "one.yaml")], cache_dir=tmp_path / "cache", console=Console(stderr=True, quiet=True))
    assert code == 0
    out = tmp_path / "out" / "default"
    assert (out / "model.mlpackage").is_dir()
    x = np.ones((1, 4), np.float32)
    got = InferenceSession(out, native=False).run({"state": x})
    np.testing.assert_allclose(got["0/out"], x @ (np.arange(16, dtype=np.float32).reshape(4, 4) / 10), rtol=1e-5)
