"""Each recipe field has one owner: the recipe model (types, allowed values, defaults) or the
load-time check (what needs the registry). A mistake in any of them is refused by `edgebuild
validate` at its file:line, and what runs later reads the validated value as it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgebuild.recipe.model import COMPUTE_POLICIES, Compute, Quantization
from edgebuild.recipe.passes import installed_passes, pass_switches, unknown_passes
from edgebuild.registry import get_registry
from edgebuild_testplugin.cli_runner import assert_usage_error
from edgebuild_testplugin.models import tiny_model
from edgebuild_testplugin.recipes import BASE_RECIPE

# (id, the line appended to the seven-line recipe, location, phrase of the message)
CASES = [
    ("pass-unknown", "optimize: {passes: {fuse_everything: true}}", "recipe.yaml:8:21",
     "optimize.passes.fuse_everything: unknown pass 'fuse_everything'; installed passes: "),
    ("pass-near-miss", "optimize: {passes: {test_nop: true}}", "recipe.yaml:8:21",
     "unknown pass 'test_nop'; did you mean 'test_noop'? installed passes: "),
    ("pass-not-a-switch", "optimize: {passes: {test_noop: maybe}}", "recipe.yaml:8:32",
     "optimize.passes.test_noop: input should be a valid boolean"),
    ("policy", "compute: {policy: fastest}", "recipe.yaml:8:19", "compute.policy: must be one of auto, all, cpu_only"),
    ("override-unit", "compute: {overrides: [{match: {op_type: conv}, unit: npu}]}", "recipe.yaml:8:54",
     "compute.overrides.0.unit: must be one of ane, gpu, cpu"),
    ("override-regex", "compute: {overrides: [{match: {name: 'conv[('}, unit: cpu}]}", "recipe.yaml:8:",
     "compute.overrides.0.match.name: not a valid regular expression"),
    ("activations", "quantization: {activations: int8}", "recipe.yaml:8:29",
     "quantization.activations: must be one of keep, float"),
]


@pytest.mark.parametrize("line, where, phrase", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_field_is_refused_at_load_with_its_location(tmp_path, monkeypatch, cli, line, where, phrase):
    monkeypatch.chdir(tmp_path)
    tiny_model(tmp_path / "m.onnx")
    Path("recipe.yaml").write_text(BASE_RECIPE + line + "\n")
    code, out, err = cli("validate", "recipe.yaml")
    assert_usage_error(code, err, where, phrase)
    assert err.startswith("error: ") and out == "", err


def test_the_unknown_pass_message_lists_every_installed_pass():
    registry = get_registry()
    listed = installed_passes(registry).split(", ")
    assert "test_noop" in listed and listed == sorted(listed)
    assert unknown_passes({"test_noop": True, "nope": False}, registry) == ["nope"]


def test_a_pass_default_is_read_once_when_the_switches_are_made():
    registry = get_registry()
    defaults = pass_switches({}, registry)
    assert list(defaults) == registry.names("passes")  # every installed pass, in registration order
    assert defaults["test_noop"] is False  # NoopPass.default
    switched = pass_switches({"test_noop": True}, registry)
    assert switched["test_noop"] is True
    assert pass_switches(switched, registry) == switched  # a complete map is taken as it is


def test_the_optimize_stage_does_not_check_pass_names_again():
    """The names were checked at load: the stage selects from the switches and raises nothing."""
    from edgebuild.graph.optimize import enabled_passes

    registry = get_registry()
    chosen = [name for name, _ in enabled_passes({"test_noop": True, "not_installed": True}, registry)]
    assert "test_noop" in chosen and "not_installed" not in chosen


def test_the_optimize_stage_takes_activations_from_the_recipe_model():
    from edgebuild.graph.optimize import _activations

    assert _activations(None) == Quantization().activations == "keep"
    assert _activations(Quantization(activations="float")) == "float"
    assert _activations(Quantization(activations="float").model_dump(mode="json")) == "float"


def test_the_recipe_holds_the_one_list_of_compute_policies():
    assert COMPUTE_POLICIES == ("auto", "all", "cpu_only", "cpu_and_gpu", "cpu_and_ne", "ane_only", "gpu_only")
    assert Compute().policy == "auto" and Compute().policy in COMPUTE_POLICIES


def test_a_bad_value_set_after_load_never_reaches_a_stage(tmp_path, monkeypatch):
    """The models check assignments too; a pass name no plugin registered is dropped from the
    switches the optimize stage gets, so no stage needs a check of its own."""
    from pydantic import ValidationError

    from edgebuild.build.jobs import load_variants

    monkeypatch.chdir(tmp_path)
    tiny_model(tmp_path / "m.onnx")
    Path("recipe.yaml").write_text(BASE_RECIPE)
    registry = get_registry()
    [variant] = load_variants(["recipe.yaml"], None, registry)
    recipe = variant.recipe
    for section, field, value in [(recipe.compute, "policy", "fastest"), (recipe.quantization, "activations", "int8"),
                                  (recipe.optimize, "passes", {"test_noop": "maybe"}),
                                  (recipe.target, "precision", "float8")]:
        with pytest.raises(ValidationError):
            setattr(section, field, value)
    recipe.optimize.passes = {"not_installed": True}
    assert "not_installed" not in pass_switches(recipe.optimize.passes, registry)
