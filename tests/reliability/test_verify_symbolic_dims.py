"""``edgebuild verify ARTIFACT --reference MODEL`` when the source model's inputs have symbolic dims
(a batch ``n``, or -1 as some exporters write): both sides run at the shapes the artifact takes,
instead of a crash ("negative dimensions are not allowed") or a batch of 1 the artifact refuses."""

from __future__ import annotations

import json
import shutil

import onnx
import pytest

from edgebuild.verify.shapes import at_artifact_shapes
from edgebuild_testplugin.models import tiny_model


def with_batch(source, path, batch: int):
    """``source`` with its input's and output's first dim set to ``batch`` (-1: what some exporters write)."""
    model = onnx.load(source)
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_value = batch
    onnx.save(model, path)
    return path


def artifact_of(model, folder):
    """A testcopy artifact: a folder holding the model the runtime runs."""
    folder.mkdir()
    shutil.copy(model, folder / "model.onnx")
    return folder


# (id, source's batch dim, artifact's batch dim): None keeps the symbolic "n"
CASES = [
    ("symbolic-source-fixed-artifact", None, 2),
    ("minus-one-source-fixed-artifact", -1, 3),
    ("minus-one-source-symbolic-artifact", -1, None),
    ("symbolic-both", None, None),
]


@pytest.mark.parametrize("source_batch, artifact_batch", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_verify_feeds_the_artifacts_shapes(tmp_path, cli, source_batch, artifact_batch):
    symbolic = tiny_model(tmp_path / "tiny.onnx")
    source = symbolic if source_batch is None else with_batch(symbolic, tmp_path / "source.onnx", source_batch)
    built = symbolic if artifact_batch is None else with_batch(symbolic, tmp_path / "built.onnx", artifact_batch)
    code, out, err = cli("verify", artifact_of(built, tmp_path / "art"), "--reference", source, "--samples", "2",
                         "--json")
    assert code == 0, err
    assert "internal error" not in err and "Traceback" not in err
    metrics = json.loads(out)["runtimes"]["testcopy"]["metrics"]["y"]
    assert metrics["compared"]["min"] == 4 * (artifact_batch or 1)  # every element, at the artifact's batch


def test_verify_a_built_variant_of_a_symbolic_source(project, cli, tmp_path):
    recipe = project()  # tiny.onnx has x: [n, 4]; the recipe pins [2, 4]
    code, _, err = cli("run", recipe)
    assert code == 0, err
    code, out, err = cli("verify", tmp_path / "out" / "default" / "model", "--reference", tmp_path / "tiny.onnx",
                         "--json")
    assert code == 0, err
    assert json.loads(out)["failures"] == []


def test_artifact_shapes_by_its_own_names_and_only_at_the_sources_rank():
    source = {"input.1": {"shape": [1, 3, -1], "dtype": "float32"}, "mask": {"shape": [1, 7], "dtype": "int64"}}
    specs = at_artifact_shapes(source, {"input_1": [1, 3, 16], "mask": [7]}, {"input.1": "input_1"})
    assert specs["input.1"] == {"shape": [1, 3, 16], "dtype": "float32"}  # renamed, taken from the artifact
    assert specs["mask"]["shape"] == [1, 7]  # another rank: the source's own sizes
    assert at_artifact_shapes(source, None)["input.1"]["shape"] == [1, 3, 1]  # no artifact shapes: -1 read as 1
