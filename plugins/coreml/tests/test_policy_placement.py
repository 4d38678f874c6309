"""Compute policies tell the truth.

- ``ane_only`` / ``gpu_only`` enforce placement, not eligibility: ops the plan puts on the CPU
  fail the build (exit 1) even when the rules would allow them on the required unit.
- A policy that allows the Neural Engine but ends with nothing on it warns, with the top reasons.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import coremltools as ct
import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types

from edgebuild.errors import BuildError
from edgebuild_coreml import compute
from edgebuild_coreml.ane import plan_program


def small_program(dtype):
    """add then relu on four numbers: every op ANE-eligible in fp16, far too small to be worth the trip."""
    np_dtype = np.float16 if dtype == types.fp16 else np.float32

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 4), dtype=dtype)], opset_version=ct.target.iOS17)
    def prog(x):
        return mb.relu(x=mb.add(x=x, y=np.ones((1, 4), np_dtype), name="bump"), name="act")

    return prog


def conv_program():
    """A 64-channel 3x3 convolution on a 56x56 fp16 image: worth running on the Neural Engine."""
    weight = np.random.default_rng(0).standard_normal((64, 64, 3, 3)).astype(np.float16)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 64, 56, 56), dtype=types.fp16)], opset_version=ct.target.iOS17)
    def prog(x):
        return mb.relu(x=mb.conv(x=x, weight=weight, pad_type="same", name="conv"), name="act")

    return prog


# -- strict policies: placement ----------------------------------------------------------------


def test_ane_only_fails_when_eligible_ops_are_placed_on_the_cpu():
    plan = plan_program(small_program(types.fp16), policy="ane_only")
    assert all(not any(r.blocking for r in op.ane_reasons) for op in plan.ops)  # eligible, every one
    assert {op.unit for op in plan.ops} == {"cpu"}
    error = compute.violation_error(plan, "small.yaml (default)")
    assert error is not None and error.exit_code == 1
    assert [(v["name"], v["placed"]) for v in error.violations] == [("bump", "cpu"), ("act", "cpu")]
    message = str(error)
    assert "ane_only" in message and "places 2 of 2 op(s) on the CPU" in message
    assert "add 'bump' is cheaper on the CPU" in message and "relu 'act'" in message and "fix:" in message


def test_ane_only_passes_when_the_plan_puts_everything_on_the_ane():
    plan = plan_program(conv_program(), policy="ane_only")
    assert {op.unit for op in plan.ops} == {"ane"}
    assert compute.violation_error(plan, "conv.yaml (default)") is None


def test_gpu_only_names_the_ops_placed_elsewhere_and_why():
    plan = plan_program(small_program(types.fp32), policy="gpu_only")
    off = [op for op in plan.ops if op.unit != "gpu"]
    violations = plan.violations()
    assert [v["name"] for v in violations] == [op.name for op in off]
    assert all(v["unit"] == "gpu" and v["reasons"] and v["reasons"][0]["message"] for v in violations)


# -- a policy allowing the ANE, with nothing on it ---------------------------------------------


def test_zero_percent_on_the_ane_warns_with_the_top_reasons():
    fp32 = compute.ane_absence_warning(plan_program(small_program(types.fp32), policy="cpu_and_ne"), "m.yaml (v)")
    assert fp32 is not None and "cpu_and_ne allows the Neural Engine" in fp32 and "0%" in fp32
    assert "fp16 only" in fp32 and "(2 ops" in fp32  # the dtype rule, counted over both ops
    small = compute.ane_absence_warning(plan_program(small_program(types.fp16), policy="auto"), "m.yaml (v)")
    assert small is not None and "cheaper on the" in small


def test_no_warning_when_the_ane_is_used_or_not_allowed():
    assert compute.ane_absence_warning(plan_program(conv_program(), policy="cpu_and_ne"), "m") is None
    assert compute.ane_absence_warning(plan_program(small_program(types.fp32), policy="cpu_only"), "m") is None
    assert compute.ane_absence_warning(plan_program(small_program(types.fp32), policy="cpu_and_gpu"), "m") is None


# -- whole builds ------------------------------------------------------------------------------


def small_onnx(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["a"], name="bump"), helper.make_node("Relu", ["a"], ["y"], name="act")],
        "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.ones((1, 4), np.float32), "one")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def build(tmp_path: Path, body: str) -> tuple[int, str]:
    from rich.console import Console

    from edgebuild.build.run import run_recipes

    small_onnx(tmp_path / "small.onnx")
    recipe = tmp_path / "small.yaml"
    recipe.write_text("edgebuild: 1\nname: small\nsource:\n  model: small.onnx\n"
                      "  inputs: {x: {shape: [1, 4], dtype: float32}}\n" + body + "outputs: {dir: out}\n")
    out = io.StringIO()
    try:
        code = run_recipes([str(recipe)], cache_dir=str(tmp_path / "cache"), console=Console(file=out, width=400))
    except BuildError as exc:  # raised before any stage (recipe checks)
        return exc.exit_code, str(exc)
    return code, out.getvalue()


def test_a_build_under_ane_only_with_ops_on_the_cpu_exits_1(tmp_path):
    code, log = build(tmp_path, "target: {backend: coreml, precision: float16}\ncompute: {policy: ane_only}\n")
    assert code == 1, log
    assert "ane_only" in log and "on the CPU" in log and log.count("is cheaper on the CPU") >= 2  # add, relu
    assert not (tmp_path / "out").exists()


def test_a_build_under_cpu_and_ne_with_nothing_on_the_ane_warns(tmp_path):
    code, log = build(tmp_path, "target: {backend: coreml, precision: float32}\ncompute: {policy: cpu_and_ne}\n")
    assert code == 0, log
    assert "warning" in log and "0% of the model" in log and "fp16 only" in log
    report = json.loads((tmp_path / "out" / "default" / "report.json").read_text())
    assert any("0% of the model" in w for w in report["lower"]["warnings"])
