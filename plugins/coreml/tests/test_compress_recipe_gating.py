"""A compression mode the deployment target lacks is a recipe error at load time, with its location."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from edgebuild.build.jobs import load_variants
from edgebuild.errors import RecipeError
from edgebuild.registry import get_registry

RECIPE = """\
edgebuild: 1
name: gate
source: {{model: m.onnx, inputs: {{x: {{shape: [2, 4]}}}}}}
target: {{backend: coreml, deployment_target: {target}}}
variants:
  int4:
    compression:
      weights: {{mode: linear, dtype: int4, granularity: per_block, block_size: 32}}
  palette3: {{compression: {{weights: {{mode: palettize, nbits: 3}}}}}}
"""


def test_per_block_int4_on_ios17_is_refused_before_building(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.yaml").write_text(RECIPE.format(target="iOS17"))
    with pytest.raises(RecipeError) as info:
        load_variants(["r.yaml"], None, get_registry())
    assert str(info.value).startswith(
        "r.yaml:8:7 compression: 4-bit per-block linear quantisation needs iOS18; the recipe targets iOS17")
    assert info.value.exit_code == 2


def test_variant_overrides_are_gated_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.yaml").write_text(RECIPE.format(target="iOS17"))
    with pytest.raises(RecipeError, match=r"3-bit palettisation needs iOS18.*\n.*in variant 'palette3'"):
        load_variants(["r.yaml"], ["palette3"], get_registry())


def test_the_same_recipe_on_ios18_loads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # a recipe that loads is checked against its model too: x must exist with rank 2
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    (tmp_path / "r.yaml").write_text(RECIPE.format(target="iOS18"))
    assert [v.name for v in load_variants(["r.yaml"], None, get_registry())] == ["int4", "palette3"]
