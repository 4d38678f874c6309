"""The recipe's generate section: its values, the stateful target it needs, and the cache names
it pairs (checked against the source model at load, exit 2 with file:line, no traceback)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from edgebuild.errors import RecipeError
from edgebuild.recipe.generate import GenerateSection, cache_pairs
from edgebuild_testplugin.cli_runner import assert_usage_error

INPUTS = ["input_ids", "attention_mask", "past_key_values.0.key", "past_key_values.0.value"]
OUTPUTS = ["logits", "present.0.key", "present.0.value"]


def _cache_graph(path, inputs=INPUTS, outputs=OUTPUTS):
    """A graph with a decoder's names: each present output concatenates its past with a new row."""
    import onnx
    from onnx import TensorProto, helper

    values = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "q"])]
    values += [helper.make_tensor_value_info(name, TensorProto.INT64, ["b", "t"]) for name in inputs
               if name not in ("input_ids",) and not name.startswith("past")]
    past = [name for name in inputs if name.startswith("past")]
    values += [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["b", 2, "p", 4]) for name in past]
    nodes = [helper.make_node("Cast", ["input_ids"], ["logits"], to=TensorProto.FLOAT)]
    nodes += [helper.make_node("Concat", [p, p], [o], axis=2) for p, o in zip(past, outputs[1:])]
    outs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "q"])]
    outs += [helper.make_tensor_value_info(o, TensorProto.FLOAT, ["b", 2, "t", 4]) for o in outputs[1:]]
    onnx.save(helper.make_model(helper.make_graph(nodes, "decoder", values, outs),
                                opset_imports=[helper.make_opsetid("", 17)]), path)


RECIPE = """\
edgebuild: 1
name: decoder
source:
  model: decoder.onnx
  inputs: {{{inputs}}}
target: {{backend: testcopy, deployment_target: {target}, precision: float32}}
generate:
{generate}
outputs: {{dir: out}}
"""


@pytest.fixture
def recipe(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEBUILD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    _cache_graph(tmp_path / "decoder.onnx")

    def write(generate: str = "  max_context: 64\n  query_lengths: [1, 16]", target: str = "iOS18", inputs=""):
        path = tmp_path / "recipe.yaml"
        path.write_text(RECIPE.format(generate=generate, target=target, inputs=inputs))
        return path

    return write


def test_section_defaults_and_lengths():
    section = GenerateSection(max_context=256, query_lengths=[64, 1])
    assert section.cache == "auto" and section.logits == "all"
    assert section.lengths() == [64, 1] and section.longest_query == 64
    ranged = GenerateSection(max_context=256, query_lengths={"range": [1, 32]})
    assert ranged.describe_lengths() == {"range": [1, 32]}


@pytest.mark.parametrize("lengths, phrase", [
    ([16, 64], "must include 1"),
    ([1, 512], "exceeds max_context 256"),
    ({"range": [2, 8]}, "must include 1"),
    ({"range": [8, 1]}, "reversed"),
    ([1, 1], "listed twice"),
])
def test_bad_query_lengths(lengths, phrase):
    with pytest.raises(ValidationError, match=phrase):
        GenerateSection(max_context=256, query_lengths=lengths)


def test_auto_pairs_past_key_values_and_past_key_n():
    section = GenerateSection(max_context=8)
    assert cache_pairs(section, INPUTS, OUTPUTS) == [("past_key_values.0.key", "present.0.key"),
                                                     ("past_key_values.0.value", "present.0.value")]
    inputs = ["input_ids", "past_key.0", "past_value.0", "past_key.1", "past_value.1"]
    outputs = ["logits", "present_key.0", "present_value.0", "present_key.1", "present_value.1"]
    assert cache_pairs(section, inputs, outputs)[2] == ("past_key.1", "present_key.1")


def test_auto_without_cache_names_the_inputs():
    with pytest.raises(RecipeError, match="inputs are input_ids, attention_mask") as error:
        cache_pairs(GenerateSection(max_context=8), ["input_ids", "attention_mask"], ["logits"])
    assert error.value.path == ("generate", "cache")


def test_load_accepts_a_generative_recipe(recipe, cli):
    code, _, err = cli("validate", recipe())
    assert code == 0, err


def test_ios17_target_is_refused(recipe, cli):
    code, _, err = cli("validate", recipe(target="iOS17"))
    assert_usage_error(code, err, "recipe.yaml:6", "target.deployment_target", "generate", "iOS18")


def test_wrong_cache_name_lists_the_inputs(recipe, cli):
    generate = "  max_context: 64\n  cache: [{input: past_key_values.0.kye, output: present.0.key}]"
    code, _, err = cli("validate", recipe(generate))
    assert_usage_error(code, err, "generate.cache.0.input", "'past_key_values.0.kye'",
                       "its inputs are input_ids, attention_mask, past_key_values.0.key")


def test_wrong_cache_output_lists_the_outputs(recipe, cli):
    generate = "  max_context: 64\n  cache: [{input: past_key_values.0.key, output: present.0.k}]"
    code, _, err = cli("validate", recipe(generate))
    assert_usage_error(code, err, "generate.cache.0.output", "'present.0.k'", "its outputs are logits")


def test_query_length_beyond_context(recipe, cli):
    code, _, err = cli("validate", recipe("  max_context: 8\n  query_lengths: [1, 16]"))
    assert_usage_error(code, err, "recipe.yaml:8", "generate", "query length 16 exceeds max_context 8")


@pytest.mark.parametrize("name, spec", [("input_ids", "{shape: [1, 8], dtype: int64}"),
                                        ("past_key_values.0.key", "{shape: [1, 2, 8, 4]}"),
                                        ("attention_mask", "{shape: [1, 8], dtype: int64}")])
def test_source_inputs_may_not_pin_what_generate_sizes(recipe, cli, name, spec):
    code, _, err = cli("validate", recipe(inputs=f"{name}: {spec}"))
    assert_usage_error(code, err, f"source.inputs.{name}", "sizes", "leave it out of source.inputs")
