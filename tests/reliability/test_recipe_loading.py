"""Loading recipes: the work grows linearly with the number of variants; bytes YAML forbids and
merge keys are handled as YAML says; read-only commands create no directories; a model whose
input has no name is refused with a message, not a traceback.

No test here times anything: linearity is asserted on counts that do not depend on the machine
(lines of edgebuild's code run, values handed to the recipe model).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from edgebuild_testplugin.cli_runner import assert_usage_error
from edgebuild_testplugin.recipes import BASE_RECIPE

from .test_recipes import write_model

EDGEBUILD = str(Path(__import__("edgebuild").__file__).parent)


def many_variants(count: int) -> str:
    lines = [f"  v{i}: {{target: {{precision: float16}}, metadata: {{description: 'variant {i}'}}}}"
             for i in range(count)]
    return BASE_RECIPE + "variants:\n" + "\n".join(lines) + "\n"


def _size(value) -> int:
    """Values in a JSON-like structure: what pydantic walks when it validates or dumps it."""
    if isinstance(value, dict):
        return 1 + sum(_size(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return 1 + sum(_size(v) for v in value)
    return 1


def loading_work(root: Path, count: int) -> tuple[int, int]:
    """(lines of edgebuild code run, values validated and dumped) to load ``count`` variants and
    compute every variant's cache-key parameters, as `edgebuild validate` does."""
    from edgebuild.recipe import loader

    recipe = root / f"recipe{count}.yaml"
    recipe.write_text(many_variants(count))
    validated = 0
    validate = loader._validate

    def counting_validate(data, locations, prefix_variant=None):
        nonlocal validated
        validated += _size(data) + len(locations)
        return validate(data, locations, prefix_variant)

    lines = 0

    def trace(frame, event, arg):
        nonlocal lines
        if not frame.f_code.co_filename.startswith(EDGEBUILD):
            return None
        if event == "line":
            lines += 1
        return trace

    loader._validate = counting_validate
    sys.settrace(trace)
    try:
        variants = loader.load_recipe(recipe)
        dumped = sum(_size(v.params) for v in variants)
    finally:
        sys.settrace(None)
        loader._validate = validate
    assert len(variants) == count
    return lines, validated + dumped


def test_loading_work_grows_linearly_with_the_variants(tmp_path):
    """Four times the variants is about four times the work; the quadratic loader (every variant
    validated and dumped with all the others, locations filtered per variant) did sixteen."""
    write_model(tmp_path / "m.onnx")
    small_lines, small_values = loading_work(tmp_path, 150)
    large_lines, large_values = loading_work(tmp_path, 600)
    assert large_lines / small_lines < 4.6, (small_lines, large_lines)
    assert large_values / small_values < 4.6, (small_values, large_values)


def test_each_variant_is_validated_as_the_recipe_it_builds(tmp_path):
    """A variant's recipe holds its own settings, not every other variant's overrides."""
    from edgebuild.recipe.loader import load_recipe

    write_model(tmp_path / "m.onnx")
    (tmp_path / "recipe.yaml").write_text(many_variants(3))
    variants = load_recipe(tmp_path / "recipe.yaml")
    assert [v.name for v in variants] == ["v0", "v1", "v2"]
    assert [v.recipe.target.precision for v in variants] == ["float16"] * 3
    assert [v.recipe.metadata.description for v in variants] == ["variant 0", "variant 1", "variant 2"]
    assert all(v.recipe.variants == {} and "v1" not in v.params["variants"] for v in variants)
    assert str(variants[2].locations[("metadata", "description")]).endswith("recipe.yaml:11:62")


def test_a_changed_model_is_read_again(tmp_path):
    """Model inputs are read once per file for all variants, and again when the file changes."""
    import onnx
    from onnx import TensorProto, helper

    from edgebuild.recipe.loader import load_recipe
    from edgebuild.recipe.checks import check_variant
    from edgebuild.registry import get_registry

    write_model(tmp_path / "m.onnx")
    (tmp_path / "recipe.yaml").write_text(BASE_RECIPE)
    check_variant(load_recipe(tmp_path / "recipe.yaml")[0], get_registry())
    graph = helper.make_graph([helper.make_node("Identity", ["z"], ["y"])], "other",
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    from edgebuild.errors import RecipeError

    with pytest.raises(RecipeError, match="the model has no input 'x'"):
        check_variant(load_recipe(tmp_path / "recipe.yaml")[0], get_registry())


# --- bytes YAML does not allow ---------------------------------------------------------------

CONTROL_CASES = [
    ("nul-in-a-value", BASE_RECIPE.replace("name: tiny", "name: ti\x00ny"), "recipe.yaml:2:9", "U+0000 (NUL)"),
    ("bell-in-a-value", BASE_RECIPE.replace("name: tiny", "name: ti\x07ny"), "recipe.yaml:2:9", "U+0007 (BEL)"),
    ("escape-in-a-comment", BASE_RECIPE + "# colour \x1b[31m\n", "recipe.yaml:8:10", "U+001B (ESC)"),
    ("nul-in-a-key", BASE_RECIPE + "meta\x00data: {}\n", "recipe.yaml:8:5", "U+0000 (NUL)"),
    ("delete-after-a-tab", BASE_RECIPE + "metadata: {description: '\t\x7f'}\n", "recipe.yaml:8:27", "U+007F (DEL)"),
    ("nul-on-the-first-line", "\x00" + BASE_RECIPE, "recipe.yaml:1:1", "U+0000 (NUL)"),
]


@pytest.mark.parametrize("text, where, phrase", [c[1:] for c in CONTROL_CASES], ids=[c[0] for c in CONTROL_CASES])
def test_a_control_byte_is_exit_2_at_its_position(tmp_path, monkeypatch, cli, text, where, phrase):
    monkeypatch.chdir(tmp_path)
    write_model(tmp_path / "m.onnx")
    (tmp_path / "recipe.yaml").write_bytes(text.encode())
    code, _, err = cli("validate", "recipe.yaml")
    assert_usage_error(code, err, where, phrase, "is not allowed in YAML")


def test_an_escaped_control_character_in_quotes_is_accepted(tmp_path, monkeypatch, cli):
    """What the message suggests works: a double-quoted escape is YAML's way to write the byte."""
    monkeypatch.chdir(tmp_path)
    write_model(tmp_path / "m.onnx")
    (tmp_path / "recipe.yaml").write_text(BASE_RECIPE + 'metadata: {description: "bell \\x07"}\n')
    code, _, err = cli("validate", "recipe.yaml")
    assert code == 0, err


# --- merge keys --------------------------------------------------------------------------------

MERGED = BASE_RECIPE.replace("target: {backend: testcopy, precision: float32}",
                             "target: &target {backend: testcopy, precision: float32}") + """\
variants:
  half:
    target:
      <<: *target
      precision: float16
  full:
    target: {<<: *target}
"""


def test_a_merge_key_then_an_override_loads_and_the_override_wins(tmp_path):
    from edgebuild.recipe.loader import load_recipe

    write_model(tmp_path / "m.onnx")
    (tmp_path / "recipe.yaml").write_text(MERGED)
    half, full = load_recipe(tmp_path / "recipe.yaml")
    assert (half.recipe.target.backend, half.recipe.target.precision) == ("testcopy", "float16")
    assert (full.recipe.target.backend, full.recipe.target.precision) == ("testcopy", "float32")
    # the override is located where it is written, a merged value where the anchor wrote it
    assert str(half.locations[("target", "precision")]).endswith("recipe.yaml:12:18")
    assert str(half.locations[("target", "backend")]).endswith("recipe.yaml:7:27")


def test_a_bad_merged_value_is_reported_where_the_anchor_wrote_it(tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    write_model(tmp_path / "m.onnx")
    (tmp_path / "recipe.yaml").write_text(BASE_RECIPE + "metadata: &meta {descripton: x}\n"
                                          "variants:\n  a: {metadata: {<<: *meta, license: MIT}}\n")
    code, _, err = cli("validate", "recipe.yaml")
    assert_usage_error(code, err, "recipe.yaml:8:18", "descripton")


def test_earlier_merged_mappings_win_over_later_ones(tmp_path):
    from edgebuild.recipe.loader import load_recipe

    write_model(tmp_path / "m.onnx")
    (tmp_path / "recipe.yaml").write_text(BASE_RECIPE.replace("target: {backend: testcopy, precision: float32}", """\
variants:
  a:
    metadata: &first {description: first}
  b:
    metadata: &second {description: second, license: MIT}
  c:
    metadata: {<<: [*first, *second]}
target: {backend: testcopy, precision: float32}"""))
    c = load_recipe(tmp_path / "recipe.yaml", only=["c"])[0]
    assert (c.recipe.metadata.description, c.recipe.metadata.license) == ("first", "MIT")
    assert str(c.locations[("metadata", "description")]).endswith("recipe.yaml:9:36")


@pytest.mark.parametrize("text, where, key", [
    (BASE_RECIPE + "name: again\n", "recipe.yaml:8:1", "name"),
    (MERGED + "    target: {}\n", "recipe.yaml:15:5", "variants.full.target"),
    (MERGED.replace("      precision: float16", "      precision: float16\n      precision: float32"),
     "recipe.yaml:13:7", "variants.half.target.precision"),
], ids=["top-level", "beside-a-merge", "override-twice"])
def test_true_duplicate_keys_are_still_refused(tmp_path, monkeypatch, cli, text, where, key):
    monkeypatch.chdir(tmp_path)
    write_model(tmp_path / "m.onnx")
    (tmp_path / "recipe.yaml").write_text(text)
    code, _, err = cli("validate", "recipe.yaml")
    assert_usage_error(code, err, f"{where} {key}: duplicate key")


def test_syntax_errors_keep_their_location(tmp_path, monkeypatch, cli):
    """The fast parser hands errors to the pure-Python one, whose messages and positions they were."""
    monkeypatch.chdir(tmp_path)
    write_model(tmp_path / "m.onnx")
    (tmp_path / "recipe.yaml").write_text(BASE_RECIPE + "metadata: {description: [unclosed}\n")
    code, _, err = cli("validate", "recipe.yaml")
    assert_usage_error(code, err, "recipe.yaml:8:", "invalid YAML")


# --- nothing is created that the user did not name as an output ------------------------------

def test_schema_out_in_a_missing_folder_is_exit_2_and_creates_nothing(tmp_path, cli):
    code, out, err = cli("schema", "--out", tmp_path / "missing" / "deeper" / "x.json")
    assert_usage_error(code, err, f"directory {tmp_path / 'missing' / 'deeper'} does not exist")
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("command", [("cache", "ls"), ("cache", "info"), ("config",), ("plan", "recipe.yaml"),
                                     ("validate", "recipe.yaml")], ids=lambda c: "-".join(c).replace(".yaml", ""))
@pytest.mark.parametrize("given", ["option", "environment"])
def test_read_only_commands_create_no_cache_dir(tmp_path, monkeypatch, cli, command, given):
    monkeypatch.chdir(tmp_path)
    write_model(tmp_path / "m.onnx")
    (tmp_path / "recipe.yaml").write_text(BASE_RECIPE)
    store = tmp_path / "missing" / "zz"
    if given == "option" and command[0] != "validate":
        args = (*command, "--cache-dir", store)
    else:
        monkeypatch.setenv("EDGEBUILD_CACHE_DIR", str(store))
        args = command
    code, _, err = cli(*args)
    assert code == 0, err
    assert not (tmp_path / "missing").exists()


# --- a model input with an empty name ----------------------------------------------------------

def write_unnamed_input_model(path: Path) -> None:
    """y = a + "" : the second graph input has an empty name."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Add", ["a", ""], ["y"])], "unnamed",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 4]),
                               helper.make_tensor_value_info("", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


UNNAMED = "graph.input[1] (input 2 of 2) has an empty name"
UNNAMED_RECIPE = BASE_RECIPE.replace("    x: {shape: [2, 4], dtype: float32}\n", "    a: {shape: [2, 4]}\n") + \
    "outputs: {dir: out}\n"


@pytest.mark.parametrize("command", ["validate", "run"])
def test_an_unnamed_model_input_is_exit_2_naming_the_model_and_position(tmp_path, monkeypatch, cli, command):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EDGEBUILD_CACHE_DIR", str(tmp_path / "store"))
    write_unnamed_input_model(tmp_path / "m.onnx")
    (tmp_path / "recipe.yaml").write_text(UNNAMED_RECIPE)
    code, _, err = cli(command, "recipe.yaml")
    assert_usage_error(code, err, "recipe.yaml:4:10", f"m.onnx: {UNNAMED}", "m.graph.input[1].name")
    assert not (tmp_path / "out").exists()


def test_init_refuses_an_unnamed_input_and_writes_nothing(tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    write_unnamed_input_model(tmp_path / "m.onnx")
    code, _, err = cli("init", "m.onnx", "-o", "recipe.yaml")
    assert_usage_error(code, err, "m.onnx", UNNAMED, "input_names=")
    assert not (tmp_path / "recipe.yaml").exists()


def test_the_onnx_frontend_refuses_an_unnamed_input(tmp_path):
    """The frontend checks too: a source the recipe checks did not read (a download) reaches it."""
    from edgebuild.errors import UsageError
    from edgebuild.graph.frontend import OnnxFrontend

    write_unnamed_input_model(tmp_path / "m.onnx")
    with pytest.raises(UsageError, match=r"graph\.input\[1\] \(input 2 of 2\) has an empty name") as refused:
        OnnxFrontend().import_model(tmp_path / "m.onnx", {}, tmp_path / "imported")
    assert refused.value.exit_code == 2 and "onnx.save" in refused.value.hint
    assert not (tmp_path / "imported" / "model.onnx").exists()
