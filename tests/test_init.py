"""``edgebuild init MODEL``: the recipe read off the graph, and the errors init refuses with.

Small graphs built with onnx.helper cover each rule (embedding tables, a dequantised table, a
position table, a one-hot depth, a scalar that selects a branch, dynamic dims). init writes
Core ML recipes: that they validate and build, on these graphs and on real models, is tested
with the Core ML plugin.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml
from onnx import TensorProto, helper, numpy_helper

from edgebuild_testplugin.cli_runner import edgebuild
from edgebuild_testplugin.models import encoder, save_model
from edgebuild.recipe import load_recipe

def branchy(path: Path) -> Path:
    """x [N, 8] float; ``mode`` a scalar compared with 2 to pick a Where branch; ``label`` a one-hot index."""
    inits = [numpy_helper.from_array(np.array(2, dtype=np.int64), "two"),
             numpy_helper.from_array(np.array(5, dtype=np.int64), "depth"),
             numpy_helper.from_array(np.array([0.0, 1.0], dtype=np.float32), "off_on")]
    nodes = [
        helper.make_node("Equal", ["mode", "two"], ["is_two"]),
        helper.make_node("Relu", ["x"], ["relu"]),
        helper.make_node("Neg", ["x"], ["neg"]),
        helper.make_node("Where", ["is_two", "relu", "neg"], ["y"]),
        helper.make_node("OneHot", ["label", "depth", "off_on"], ["onehot"]),
        helper.make_node("Cast", ["flags"], ["flags_bool"], to=TensorProto.BOOL),
        helper.make_node("Not", ["flags_bool"], ["z"]),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8]),
              helper.make_tensor_value_info("mode", TensorProto.INT64, []),
              helper.make_tensor_value_info("label", TensorProto.INT64, [1]),
              helper.make_tensor_value_info("flags", TensorProto.INT32, [1, 3])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8]),
               helper.make_tensor_value_info("onehot", TensorProto.FLOAT, [1, 5]),
               helper.make_tensor_value_info("z", TensorProto.BOOL, [1, 3])]
    return save_model(path, nodes, inputs, outputs, inits)


def init(model: Path, out: Path, *extra) -> dict:
    done = edgebuild("init", model, "-o", out, *extra)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(out.read_text())


def test_encoder_inputs_become_tokens_with_the_vocabulary_read_from_the_table(tmp_path):
    recipe = init(encoder(tmp_path / "enc.onnx"), tmp_path / "enc.yaml")
    inputs = recipe["source"]["inputs"]
    # the sequence pin is capped by the 64-row position table; batch is 1
    assert inputs["input_ids"] == {"shape": [1, 64], "dtype": "int64"}
    assert inputs["attention_mask"]["shape"] == inputs["token_type_ids"]["shape"] == [1, 64]
    generators = recipe["validate"]["inputs"]
    assert generators["input_ids"] == {"tokens": {"vocab_size": 1000, "seed": 0}}
    # attention_mask and token_type_ids follow the tokens (ones / zeros), so they are left out
    assert set(generators) == {"input_ids"}
    text = (tmp_path / "enc.yaml").read_text()
    assert "range: [1, 64]" in text and "attention_mask follows input_ids" in text
    assert recipe["variants"]["fp16"]["target"]["precision"] == "float16"
    assert [v.name for v in load_recipe(tmp_path / "enc.yaml")] == ["fp32", "fp16"]


def test_a_dequantised_table_still_gives_the_vocabulary(tmp_path):
    recipe = init(encoder(tmp_path / "q.onnx", vocab=300, int8_table=True), tmp_path / "q.yaml")
    assert recipe["validate"]["inputs"]["input_ids"]["tokens"]["vocab_size"] == 300


def test_scalar_branch_selector_is_fixed_and_other_integers_get_their_range(tmp_path):
    recipe = init(branchy(tmp_path / "b.onnx"), tmp_path / "b.yaml")
    inputs = recipe["source"]["inputs"]
    assert inputs["mode"] == {"value": 2, "dtype": "int64"}
    assert inputs["x"]["shape"] == [1, 8]  # N: a dynamic batch pinned to 1
    generators = recipe["validate"]["inputs"]
    assert "mode" not in generators
    assert generators["label"]["random"] == {"low": 0, "high": 5, "seed": 0}  # one-hot depth
    assert generators["flags"]["random"] == {"low": 0, "high": 2, "seed": 0}  # cast to bool
    assert generators["x"]["random"]["low"] == -1.0
    text = (tmp_path / "b.yaml").read_text()
    assert "selects a branch (Where)" in text and "dim 0 ('N') is dynamic: pinned to 1" in text


def test_init_refuses_to_overwrite_and_writes_stdout_with_dash(tmp_path):
    model = encoder(tmp_path / "enc.onnx")
    out = tmp_path / "mine.yaml"
    out.write_text("my own recipe\n")
    done = edgebuild("init", model, "-o", out)
    assert done.returncode == 2 and "exists" in done.stderr
    assert out.read_text() == "my own recipe\n"
    done = edgebuild("init", model, "-o", "-")
    assert done.returncode == 0 and yaml.safe_load(done.stdout)["name"] == "enc"


def test_init_default_output_is_named_after_the_model(tmp_path):
    model = branchy(tmp_path / "My Model.onnx")
    edgebuild("init", model, cwd=tmp_path, check=0)
    assert yaml.safe_load((tmp_path / "My_Model.yaml").read_text())["name"] == "My_Model"


def test_not_a_model_is_a_usage_error(tmp_path):
    bad = tmp_path / "notes.onnx"
    bad.write_text("not onnx")
    done = edgebuild("init", bad, "-o", tmp_path / "r.yaml")
    assert done.returncode == 2 and "not a readable ONNX model" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "r.yaml").exists()
    assert edgebuild("init", tmp_path / "missing.onnx").returncode == 2


def only_one_fits(path: Path) -> Path:
    """x [1, M] reshaped to [1]: onnxruntime runs it only at M = 1, which nothing in the graph says."""
    inits = [numpy_helper.from_array(np.array([1], dtype=np.int64), "one")]
    nodes = [helper.make_node("Reshape", ["x", "one"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "M"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]
    return save_model(path, nodes, inputs, outputs, inits)


def test_a_dim_pinned_without_evidence_falls_back_to_one_where_onnxruntime_runs_only_that(tmp_path):
    from edgebuild.start.init import start

    model = only_one_fits(tmp_path / "m.onnx")
    for report_check in (True, False):  # a build after it (convert) still needs the size that runs
        started = start(str(model), tmp_path / "cache", report_check=report_check)
        assert started.suggestion.inputs[0].shape == [1, 1]
        assert started.checked == "onnxruntime runs the model on a sample of these inputs"


def test_a_build_after_it_skips_the_check_where_no_dim_is_a_guess(tmp_path):
    from edgebuild.start.init import start

    model = branchy(tmp_path / "m.onnx")  # its one dynamic dim is a batch: 1 by rule
    assert start(str(model), tmp_path / "cache").checked.startswith("onnxruntime runs the model")
    assert start(str(model), tmp_path / "cache", report_check=False).checked.startswith("not checked")
