"""``edgebuild verify ARTIFACT --reference MODEL --inputs FILE``: inputs random values cannot feed
(token ids, indices) get the sources a recipe's ``validate.inputs`` gives them, from a YAML file,
instead of a refusal that points at a recipe verify does not have."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

VOCAB = 10


def embedding_model(path):
    """y = table[ids]: an int64 input whose values must stay below VOCAB."""
    table = numpy_helper.from_array(np.arange(VOCAB * 4, dtype=np.float32).reshape(VOCAB, 4), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"])], "embedding",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4])], initializer=[table])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def artifact_of(model, folder):
    folder.mkdir()
    shutil.copy(model, folder / "model.onnx")
    return folder


def test_an_integer_input_without_sources_asks_for_an_inputs_file(tmp_path, cli):
    model = embedding_model(tmp_path / "m.onnx")
    code, _, err = cli("verify", artifact_of(model, tmp_path / "art"), "--reference", model)
    assert code == 2
    assert "'ids' is int64" in err and "--inputs" in err


def test_token_sources_from_an_inputs_file_are_fed_to_both_sides(tmp_path, cli):
    model = embedding_model(tmp_path / "m.onnx")
    sources = tmp_path / "inputs.yaml"
    sources.write_text(f"ids:\n  tokens: {{vocab_size: {VOCAB}}}\n")
    code, out, err = cli("verify", artifact_of(model, tmp_path / "art"), "--reference", model, "--inputs", sources,
                         "--samples", "3", "--json")
    assert code == 0, err
    record = json.loads(out)
    metrics = record["runtimes"]["testcopy"]["metrics"]["y"]
    assert record["failures"] == [] and metrics["compared"]["min"] == 12 and metrics["cosine"]["min"] > 0.9999


def test_a_file_source_is_read_beside_the_inputs_file(tmp_path, cli, monkeypatch):
    model = embedding_model(tmp_path / "m.onnx")
    (tmp_path / "data").mkdir()
    np.save(tmp_path / "data" / "ids.npy", np.array([[1, 2, 3]], dtype=np.int64))
    sources = tmp_path / "data" / "inputs.yaml"
    sources.write_text("ids: {file: ids.npy}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, out, err = cli("verify", artifact_of(model, tmp_path / "art"), "--reference", model, "--inputs", sources,
                         "--samples", "1", "--json")
    assert code == 0, err
    assert json.loads(out)["runtimes"]["testcopy"]["metrics"]["y"]["compared"]["min"] == 12


def test_a_mistake_in_the_inputs_file_names_its_line(tmp_path, cli):
    model = embedding_model(tmp_path / "m.onnx")
    sources = tmp_path / "inputs.yaml"
    sources.write_text("# sources\nids:\n  tokens: {vocab_size: 10, colour: red}\n")
    code, _, err = cli("verify", artifact_of(model, tmp_path / "art"), "--reference", model, "--inputs", sources)
    assert code == 2
    assert "inputs.yaml:3" in err and "colour" in err and "Traceback" not in err


def test_an_inputs_file_naming_an_input_the_model_lacks_is_refused(tmp_path, cli):
    model = embedding_model(tmp_path / "m.onnx")
    sources = tmp_path / "inputs.yaml"
    sources.write_text("ids: {tokens: {vocab_size: 10}}\ntoken_ids: {tokens: {vocab_size: 10}}\n")
    code, _, err = cli("verify", artifact_of(model, tmp_path / "art"), "--reference", model, "--inputs", sources)
    assert code == 2 and "no input 'token_ids'" in err


def test_a_missing_or_non_mapping_inputs_file_is_a_usage_error(tmp_path, cli):
    model = embedding_model(tmp_path / "m.onnx")
    artifact = artifact_of(model, tmp_path / "art")
    code, _, err = cli("verify", artifact, "--reference", model, "--inputs", tmp_path / "none.yaml")
    assert code == 2 and "no such file" in err
    (tmp_path / "list.yaml").write_text("- ids\n")
    code, _, err = cli("verify", artifact, "--reference", model, "--inputs", tmp_path / "list.yaml")
    assert code == 2 and "mapping from input name to source" in err
