"""Generated files are generated, not concatenated: a name from a model never becomes YAML
structure in the recipe ``edgebuild init`` writes (nor Make syntax in a depfile, nor a link's
scheme in a report page: see test_make.py and test_owned_outputs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from onnx import TensorProto, helper

from edgebuild_testplugin.cli_runner import edgebuild
from edgebuild_testplugin.models import save_model

HOSTILE_NAMES = {
    "newline-yaml": "x\nmatrix: {chip: [m1, m2]}\noutputs: {dir: /tmp/elsewhere}\n#",
    "comment": "x # not a comment",
    "colon-space": "a: b",
    "quotes": "it's \"quoted\"",
    "brace": "{x: 1}",
    "bracket": "[x]",
    "line-separator": "x\u2028compute: {policy: cpu_only}\u2029#",
    "next-line": "x\x85compute: {policy: cpu_only}\x85#",
    "carriage-return": "x\rcompute: {policy: cpu_only}\r#",
    "nul": "x\x00y",
    "escape-and-tab": "x\x1b[31m\ty",
    "bom": "\ufeffx",
    "yaml-word": "on",
    "anchor": "&a *a",
    "directive": "%YAML 1.1",
    "document-end": "...",
    "unicode": "größe_入力",
    "long": "x" * 5000,
}
TOP_LEVEL = {"edgebuild", "name", "source", "target", "validate", "variants", "outputs"}


def hostile_model(path: Path, name: str) -> Path:
    """y = relu(NAME), the input and output named ``name`` (onnx.helper takes any string)."""
    return save_model(path, [helper.make_node("Relu", [name], ["out " + name])],
                      [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 4])],
                      [helper.make_tensor_value_info("out " + name, TensorProto.FLOAT, [1, 4])], [])


def assert_one_input_named(recipe: Path, name: str) -> None:
    from edgebuild.recipe import load_recipe

    data = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    assert set(data) == TOP_LEVEL, sorted(data)
    assert list(data["source"]["inputs"]) == [name]
    assert set(data["variants"]) == {"fp32", "fp16"}
    assert data["outputs"] == {"dir": "build/m"}
    variants = load_recipe(recipe)
    assert [v.name for v in variants] == ["fp32", "fp16"]
    for variant in variants:
        assert list(variant.recipe.source.inputs) == [name]
        assert variant.recipe.outputs.dir == "build/m"


@pytest.mark.parametrize("name", list(HOSTILE_NAMES.values()), ids=list(HOSTILE_NAMES))
def test_a_hostile_input_name_is_one_input_of_that_name(tmp_path, name):
    from edgebuild.start.init import init_text, start

    model = hostile_model(tmp_path / "m.onnx", name)
    recipe = tmp_path / "m.yaml"
    recipe.write_text(init_text(start(str(model)), recipe), encoding="utf-8")
    assert_one_input_named(recipe, name)


def test_init_on_a_model_whose_input_name_holds_yaml(tmp_path):
    name = HOSTILE_NAMES["newline-yaml"]
    model = hostile_model(tmp_path / "m.onnx", name)
    done = edgebuild("init", model, "-o", tmp_path / "m.yaml")
    assert done.returncode == 0, done.stderr
    assert_one_input_named(tmp_path / "m.yaml", name)
    assert "\nmatrix:" not in (tmp_path / "m.yaml").read_text()


def test_comments_and_scalars_are_escaped():
    from edgebuild.start.render import comment, key, scalar

    for text in HOSTILE_NAMES.values():
        assert yaml.safe_load(f"k: {scalar(text)}") == {"k": text}
        assert yaml.safe_load(f"{key(text, '')} 1") == {text: 1}
        line = f"# {comment(text)}\nk: 1\n"
        assert yaml.safe_load(line) == {"k": 1}, repr(line)
    assert scalar("fp16") == "fp16" and scalar("yes") == '"yes"'
    assert yaml.safe_load(f"k: {scalar(1e-05)}") == {"k": 1e-05}
