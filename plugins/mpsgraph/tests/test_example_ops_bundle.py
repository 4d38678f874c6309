"""recipes/example_ops.yaml end to end: a three-segment bundle (Core ML -> Metal kernel ->
Core ML) whose InferenceSession output on Linux matches the source model under onnx's
reference evaluator with the op plugin's numpy reference."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def built_bundle(tmp_path_factory):
    pytest.importorskip("edgebuild_example_ops")
    pytest.importorskip("edgebuild_coreml")
    from rich.console import Console

    from edgebuild.build.run import run_recipes

    work = tmp_path_factory.mktemp("example_ops")
    (work / "models").mkdir()
    shutil.copy(ROOT / "recipes" / "models" / "example_ops.onnx", work / "models")
    recipe = yaml.safe_load((ROOT / "recipes" / "example_ops.yaml").read_text())
    recipe["outputs"] = {"dir": "out"}
    (work / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    code = run_recipes([str(work / "recipe.yaml")], cache_dir=work / "cache", console=Console(stderr=True, quiet=True))
    assert code == 0
    return work / "out" / "default"


def test_bundle_has_three_segments_with_hand_offs(built_bundle):
    manifest = json.loads((built_bundle / "bundle" / "manifest.json").read_text())
    assert [s["backend"] for s in manifest["segments"]] == ["coreml", "msl", "coreml"]
    assert [(h["tensor"], h["from_segment"], h["to_segment"]) for h in manifest["handoffs"]] == [
        ("x", None, 0), ("h4", 0, 1), ("normed", 1, 2), ("y", 2, None)]
    for segment in manifest["segments"]:
        for path in segment["files"].values():
            assert (built_bundle / "bundle" / path).exists(), path
    kernel = manifest["segments"][1]
    assert kernel["inputs"][0] == {"name": "h4", "dtype": "float32", "shape": [1, 8, 32], "layout": "row_major",
                                   "binding": None}


def test_inference_session_matches_the_reference(built_bundle, source_reference):
    from edgebuild.bundle.session import InferenceSession, compare_outputs

    x = np.random.default_rng(3).uniform(-2, 2, size=(1, 8, 32)).astype(np.float32)
    got = InferenceSession(built_bundle / "bundle", native=False).run({"x": x})
    want = source_reference(ROOT / "recipes" / "models" / "example_ops.onnx")({"x": x})
    mse, max_diff = compare_outputs(got, want)
    assert got["y"].shape == (1, 8, 32)
    assert mse < 1e-12 and max_diff < 1e-5


def test_validate_stage_passed_its_thresholds(built_bundle):
    report = json.loads((built_bundle / "report.json").read_text())
    assert report["validation"]["failures"] == []
    # the core's reference names the evaluator and who provides the custom op's reference
    assert report["validation"]["reference"].startswith(
        "onnx reference evaluator + com.example::RMSNorm (edgebuild-example-ops ")


def test_a_model_core_ml_runs_whole_stays_one_mlpackage(tmp_path):
    """target.backend: bundle on a model without custom ops: no manifest, just model.mlpackage."""
    pytest.importorskip("edgebuild_coreml")
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from rich.console import Console

    from edgebuild.build.run import run_recipes
    from edgebuild.bundle.session import InferenceSession

    w = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4) / 10, "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
         helper.make_node("Sigmoid", ["r"], ["s"]), helper.make_node("Add", ["s", "x"], ["y"])],
        "plain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "plain.onnx")
    (tmp_path / "recipe.yaml").write_text(
        "edgebuild: 1\nname: plain\nsource: {model: plain.onnx, inputs: {x: {shape: [2, 4]}}}\n"
        "target: {backend: bundle, precision: float32}\noutputs: {dir: out}\n")
    code = run_recipes([str(tmp_path / "recipe.yaml")], cache_dir=tmp_path / "cache",
                       console=Console(stderr=True, quiet=True))
    assert code == 0
    out = tmp_path / "out" / "default"
    assert (out / "model.mlpackage").is_dir() and not (out / "bundle").exists()
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    expected = 1 / (1 + np.exp(-np.maximum(x @ (np.arange(16, dtype=np.float32).reshape(4, 4) / 10), 0))) + x
    np.testing.assert_allclose(InferenceSession(out / "model.mlpackage", native=False).run({"x": x})["y"], expected,
                               rtol=1e-5, atol=1e-6)
