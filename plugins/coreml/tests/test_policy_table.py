"""compute.policy has one list of values (the recipe's ComputePolicy) and one table of what each
means for Core ML (compute.PLACEMENTS); the lower stage and the plan read the validated value."""

from __future__ import annotations

from pathlib import Path

import coremltools as ct
import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild.build.jobs import load_variants
from edgebuild.plugin.recipe import COMPUTE_POLICIES
from edgebuild.registry import get_registry
from edgebuild_coreml import compute
from edgebuild_coreml.ane.plan import STRICT_POLICIES
from edgebuild_testplugin.models import tiny_model
from edgebuild_testplugin.recipes import BASE_RECIPE


def _program():
    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 8))], opset_version=ct.target.iOS17)
    def prog(x):
        return mb.relu(x=mb.linear(x=x, weight=np.ones((4, 8), np.float32)), name="y")

    return prog


def test_every_recipe_policy_has_one_core_ml_meaning():
    assert set(compute.PLACEMENTS) == set(COMPUTE_POLICIES)
    assert STRICT_POLICIES == {"ane_only": "ane", "gpu_only": "gpu"}
    for policy, placement in compute.PLACEMENTS.items():
        assert hasattr(ct.ComputeUnit, placement.compute_units), policy
        assert placement.units[-1] == "cpu"  # Core ML always keeps the CPU as the fallback
        assert placement.strict is None or placement.strict in placement.units


def test_the_validated_policy_reaches_the_plan_as_written(tmp_path, monkeypatch):
    """recipe -> Compute model (default applied once, at load) -> variant.params' dump -> plan."""
    monkeypatch.chdir(tmp_path)
    tiny_model(Path("m.onnx"))
    Path("recipe.yaml").write_text(BASE_RECIPE.replace("testcopy", "coreml")
                                   + "compute: {policy: cpu_and_gpu, chip: m1}\n"
                                   + "variants: {plain: {compute: {policy: auto}}}\n")
    by_name = {v.name: v for v in load_variants(["recipe.yaml"], None, get_registry())}
    variant = by_name["plain"]
    assert variant.recipe.compute.policy == "auto"
    for section in (variant.recipe.compute, variant.params["compute"]):  # typed, or as stage params carry it
        plan = compute.plan_for(_program(), section)
        assert (plan.policy, plan.chip) == ("auto", "m1")
    assert compute.compute_units_for(variant.recipe.compute.policy) == ct.ComputeUnit.ALL
