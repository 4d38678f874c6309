"""The GPU's rules are evaluated while planning only under policies that allow the GPU; under the
others they are evaluated when asked for, and give what evaluating them at once gives."""

from __future__ import annotations

import coremltools as ct
import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types

from edgebuild_coreml.ane import plan as plan_module
from edgebuild_coreml.ane.plan import plan_program
from edgebuild_coreml.ane.rules import eligibility, gpu_eligibility
from edgebuild_coreml.compute import PLACEMENTS

RNG = np.random.default_rng(0)


def _program():
    """fp16 convolutions (eligible everywhere), an fp32 op (off the ANE) and int32 arithmetic
    (off the ANE and the GPU)."""

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 3, 16, 16), dtype=types.fp16),
                             mb.TensorSpec(shape=(4,), dtype=types.int32)], opset_version=ct.target.iOS17)
    def prog(x, ids):
        y = mb.conv(x=x, weight=RNG.random((8, 3, 3, 3)).astype(np.float16), pad_type="same", name="conv")
        y = mb.relu(x=y, name="relu")
        wide = mb.cast(x=y, dtype="fp32", name="widen")
        wide = mb.mul(x=wide, y=np.float32(2.0), name="scale_fp32")
        counted = mb.add(x=ids, y=np.int32(1), name="count_int32")
        return mb.cast(x=wide, dtype="fp16", name="narrow"), counted

    return prog


def _counting_gpu_rules(monkeypatch) -> list:
    calls = []

    def counted(op, *args, **kwargs):
        calls.append(op.name)
        return gpu_eligibility(op, *args, **kwargs)

    monkeypatch.setattr(plan_module, "gpu_eligibility", counted)
    return calls


@pytest.mark.parametrize("policy", sorted(PLACEMENTS))
def test_gpu_rules_run_while_planning_only_where_the_policy_allows_the_gpu(policy, monkeypatch):
    calls = _counting_gpu_rules(monkeypatch)
    plan = plan_program(_program(), chip="m3", policy=policy)
    allows_gpu = "gpu" in PLACEMENTS[policy].units
    assert len(calls) == (len(plan.ops) if allows_gpu else 0)
    if not allows_gpu:
        assert all("gpu" not in op.allowed for op in plan.ops)


@pytest.mark.parametrize("policy", sorted(PLACEMENTS))
def test_reasons_asked_for_are_the_rules_own(policy):
    program = _program()
    ops = {op.name: op for op in program.functions["main"].operations}
    plan = plan_program(program, chip="m3", policy=policy)
    assert any(r.blocking for r in plan.ops[[o.name for o in plan.ops].index("count_int32")].reasons_against("gpu"))
    for op_plan in plan.ops:
        op = ops[op_plan.name]
        assert op_plan.reasons_against("gpu") == gpu_eligibility(op, "m3")
        assert op_plan.reasons_against("ane") == eligibility(op, "m3")
        assert op_plan.reasons_against("gpu") is op_plan.reasons_against("gpu")  # evaluated once


@pytest.mark.parametrize("policy", sorted(p for p, placement in PLACEMENTS.items() if "gpu" not in placement.units))
def test_gpu_only_violations_of_a_plan_made_without_the_gpu_name_the_gpu_rules(policy):
    plan = plan_program(_program(), chip="m3", policy=policy)
    by_name = {v["name"]: v for v in plan.violations("gpu_only")}
    assert {r["rule"] for r in by_name["count_int32"]["reasons"]} == {"dtype"}
    # ops the GPU's rules allow are off it because the policy keeps them off
    assert {r["rule"] for r in by_name["conv"]["reasons"]} == {"excluded"}
