"""The sizes a generative recipe gives the inputs its artifact feeds (input_ids [1, Q] from
generate.query_lengths), handed to the import only by a frontend that sizes a source's symbolic dims
from the recipe; every other recipe's import inputs, and so its import key, stay as they were."""

from __future__ import annotations

import pytest

from edgebuild.dag.stages import import_inputs
from edgebuild.recipe import load_recipe
from edgebuild.recipe.generate import GenerateSection, derived_input_sizes

RECIPE = """\
edgebuild: 1
name: decoder
source: {{model: step.jaxexport, format: {format}}}
target: {{backend: coreml, deployment_target: iOS18}}
{generate}
outputs: {{dir: out}}
"""


class Sizing:
    sizes_derived_inputs = True


class NotSizing:
    pass


@pytest.mark.parametrize("query_lengths,query", [([1, 4], {"enumerated": [1, 4]}), ([4, 1], {"enumerated": [1, 4]}),
                                                 ({"range": [1, 4]}, {"range": [1, 4]}), ([1], 1),
                                                 ({"range": [1, 1]}, 1)],
                         ids=["enumerated", "unordered", "range", "one", "range-of-one"])
def test_input_ids_is_sized_from_query_lengths(query_lengths, query):
    section = GenerateSection.model_validate({"max_context": 16, "query_lengths": query_lengths})
    assert derived_input_sizes(section) == {"input_ids": {"sized_by": "generate.query_lengths", "shape": [1, query]}}
    assert derived_input_sizes(section, lengths_given=False) == {"input_ids": {"sized_by": "generate.query_lengths"}}


def _variant(tmp_path, generate: str, fmt: str = "stablehlo"):
    (tmp_path / "step.jaxexport").write_bytes(b"")
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE.format(format=fmt, generate=generate))
    (variant,) = load_recipe(path)
    return variant


@pytest.mark.parametrize("generate,expected", [
    ("generate: {max_context: 16, query_lengths: [1, 8]}", {"shape": [1, {"enumerated": [1, 8]}]}),
    ("generate: {max_context: 16, query_lengths: {range: [1, 8]}}", {"shape": [1, {"range": [1, 8]}]}),
    ("generate: {max_context: 16, query_lengths: [1]}", {"shape": [1, 1]}),
    ("generate: {max_context: 16}", {}),  # left at the default: a symbolic Q is refused naming the field
], ids=["enumerated", "range", "one", "default"])
def test_the_import_of_a_generative_recipe_gets_the_sizes_when_its_frontend_asks(tmp_path, generate, expected):
    variant = _variant(tmp_path, generate)
    assert import_inputs(variant, Sizing()) == {"input_ids": {"sized_by": "generate.query_lengths", **expected}}
    assert import_inputs(variant, NotSizing()) == variant.params["source"]["inputs"] == {}


def test_a_recipe_that_does_not_generate_keeps_its_import_inputs(tmp_path):
    variant = _variant(tmp_path, "")
    assert import_inputs(variant, Sizing()) is variant.params["source"]["inputs"]
