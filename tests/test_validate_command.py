"""``edgebuild validate`` checks every recipe it is given and reports each; what belongs to a
first-party plugin that is not installed says which distribution to install, and how."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgebuild_testplugin.recipes import RECIPE

GOOD = RECIPE.format(extra="")
BUNDLE = GOOD.replace("backend: testcopy", "backend: bundle")  # edgebuild-mpsgraph's backend, line 6
SYNTAX = "edgebuild: 1\nname: [unclosed\n"


@pytest.fixture
def recipes(project, core_plugins_only):
    project()
    for name, text in {"good.yaml": GOOD, "bundle.yaml": BUNDLE, "syntax.yaml": SYNTAX}.items():
        Path(name).write_text(text)
    return ["good.yaml", "bundle.yaml", "syntax.yaml"]


def test_every_recipe_is_reported_and_one_failure_makes_exit_2(recipes, cli):
    code, out, err = cli("validate", *recipes)
    assert code == 2, err
    assert out == ""
    lines = err.splitlines()
    assert "ok good.yaml: 1 variant(s): default" in lines
    assert any(line.startswith("error: bundle.yaml:6:") and "backend 'bundle'" in line for line in lines), err
    assert any(line.startswith("error: syntax.yaml:") and "invalid YAML" in line for line in lines), err
    assert "1 of 3 recipes valid" in lines
    assert "provided by edgebuild-mpsgraph" in err and "pip install ./plugins/mpsgraph" in err


def test_the_order_of_the_recipes_does_not_hide_any(recipes, cli):
    code, _, err = cli("validate", "syntax.yaml", "bundle.yaml", "good.yaml")
    assert code == 2
    assert "error: syntax.yaml" in err and "error: bundle.yaml" in err and "ok good.yaml" in err


def test_json_lists_each_recipe_and_the_first_error(recipes, cli):
    code, out, err = cli("validate", *recipes, "--json")
    assert code == 2, err
    data = json.loads(out)
    assert [(r["recipe"], r["status"]) for r in data["recipes"]] == [
        ("good.yaml", "ok"), ("bundle.yaml", "error"), ("syntax.yaml", "error")]
    good, bundle, syntax = data["recipes"]
    assert good["variants"] == ["default"] and good["error"] is None
    assert (bundle["error"]["kind"], bundle["error"]["file"], bundle["error"]["line"]) == ("recipe", "bundle.yaml", 6)
    assert "edgebuild-mpsgraph" in bundle["error"]["hint"]
    assert syntax["error"]["file"] == "syntax.yaml" and isinstance(syntax["error"]["line"], int)
    assert data["error"] == bundle["error"] and data["version"]


def test_valid_recipes_exit_0_with_no_error_in_json(recipes, cli):
    Path("other.yaml").write_text(GOOD.replace("name: tiny", "name: other"))
    code, out, err = cli("validate", "good.yaml", "other.yaml", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert "error" not in data and [r["status"] for r in data["recipes"]] == ["ok", "ok"]


def test_a_missing_recipe_is_one_of_the_results(recipes, cli):
    code, _, err = cli("validate", "good.yaml", "missing.yaml")
    assert code == 2
    assert "ok good.yaml" in err and "missing.yaml: no such recipe file" in err


def test_a_section_of_an_uninstalled_plugin_names_its_distribution(recipes, cli):
    Path("options.yaml").write_text(BUNDLE.replace("precision: float32", "precision: float32, options: {segments: 2}"))
    code, _, err = cli("validate", "options.yaml")
    assert code == 2
    assert "options.yaml:6:" in err and "target.options" in err
    assert "`bundle:target.options` recipe section is provided by edgebuild-mpsgraph" in err


def test_a_source_format_of_an_uninstalled_plugin_names_its_distribution(recipes, cli):
    Path("tiny.pt").write_bytes(b"not read: the format is refused first")
    Path("torch.yaml").write_text(GOOD.replace("model: tiny.onnx", "model: tiny.pt"))
    code, _, err = cli("validate", "torch.yaml")
    assert code == 2
    assert "no installed plugin reads 'pytorch' models" in err
    assert "provided by edgebuild-pytorch" in err and "./plugins/pytorch[torch]" in err


def test_a_command_of_an_uninstalled_plugin_names_its_distribution(core_plugins_only, cli):
    code, out, err = cli("kernels")
    assert code == 2 and out == ""
    assert "No such command 'kernels': it is provided by edgebuild-msl" in err
    assert "pip install ./plugins/msl" in err


def test_an_unknown_command_of_no_first_party_plugin_says_only_that(core_plugins_only, cli):
    code, _, err = cli("no-such-command")
    assert code == 2 and "No such command 'no-such-command'." in err and "provided by" not in err


def test_the_install_command_adds_the_first_party_distributions_needed_that_are_missing():
    from edgebuild.first_party import install_command, provider

    bundle = provider("backends", "bundle")
    assert bundle.name == "edgebuild-mpsgraph"
    assert install_command(bundle, installed={"edgebuild", "edgebuild-coreml"}) == \
        "pip install ./plugins/mpsgraph ./plugins/msl"
    assert install_command(bundle, installed={"edgebuild", "edgebuild-coreml", "edgebuild-msl"}) == \
        "pip install ./plugins/mpsgraph"
    assert provider("backends", "testcopy") is None
