"""``optimize.level`` in a Core ML build: at O3 the lower stage adds the Neural Engine layout
rewrite where the compute policy allows the Neural Engine, below O3 the lower stage is the same;
a shipped model builds and validates at every level."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgebuild.plugin import get_registry
from edgebuild.plugin.recipe import COMPUTE_POLICIES, Compute
from edgebuild_coreml.levels import compute_at_level, level_rewrites

LEVELS = ("O0", "O1", "O2", "O3")
ROOT = Path(__file__).resolve().parents[3]
# the policies whose compute units include the Neural Engine (compute.PLACEMENTS)
NEURAL_ENGINE_POLICIES = {"auto", "all", "cpu_and_ne", "ane_only"}
CHOSEN = [{}, {"clamp_norm_epsilon": True}, {"ane_layout": False}, {"linear_to_conv": True},
          {"split_attention_heads": False, "clamp_norm_epsilon": False}]


@pytest.mark.parametrize("policy", COMPUTE_POLICIES)
@pytest.mark.parametrize("level", LEVELS)
def test_only_o3_adds_the_layout_rewrite_where_the_neural_engine_may_run(policy, level):
    for chosen in CHOSEN:
        got = level_rewrites(Compute(policy=policy, rewrites=chosen), level)
        names_layout = any(n in chosen for n in ("ane_layout", "linear_to_conv", "split_attention_heads"))
        adds = level == "O3" and policy in NEURAL_ENGINE_POLICIES and not names_layout
        assert got == ({**chosen, "ane_layout": True} if adds else chosen), (policy, level, chosen)
        assert list(got)[:len(chosen)] == list(chosen)  # the recipe's own rewrites keep their order


def test_a_compute_section_the_level_leaves_alone_is_the_recipe_s_own():
    compute = Compute(policy="cpu_and_gpu")
    assert compute_at_level(compute, "O3") is compute
    ne = Compute(policy="cpu_and_ne")
    assert compute_at_level(ne, "O2") is ne
    raised = compute_at_level(ne, "O3")
    assert raised.rewrites == {"ane_layout": True} and ne.rewrites == {}  # a copy; the recipe's stays
    assert raised.model_dump(exclude={"rewrites"}) == ne.model_dump(exclude={"rewrites"})


def _mlp(path: Path) -> Path:
    """x [1, 8, 32] -> linear -> relu -> linear: rank-3 linears the layout rewrite turns into convs."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)
             for name, shape in (("w1", (32, 64)), ("b1", (64,)), ("w2", (64, 32)), ("b2", (32,)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["a1"]),
             helper.make_node("Relu", ["a1"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["m2"]),
             helper.make_node("Add", ["m2", "b2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 32])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


MLP_RECIPE = """\
edgebuild: 1
name: mlp
source: {{model: mlp.onnx, inputs: {{x: {{shape: [1, 8, 32], dtype: float32}}}}}}
target: {{backend: coreml, deployment_target: iOS17, precision: float16}}
compute: {{policy: {policy}}}
validate:
  samples: 2
  inputs: {{x: {{random: {{low: -1.0, high: 1.0, seed: 0}}}}}}
  thresholds: {{cosine_min: 0.999}}
variants:
{variants}
outputs: {{dir: out}}
"""


def _levels(extra: str = "") -> str:
    return "\n".join(f"  {level.lower()}: {{optimize: {{level: {level}}}{extra}}}" for level in LEVELS)


def _variants(recipe: Path):
    from edgebuild.build.jobs import load_variants

    return {v.name: v for v in load_variants([str(recipe)], None, get_registry())}


@pytest.mark.parametrize("policy", ["cpu_and_ne", "cpu_and_gpu"])
def test_the_lower_stage_key_changes_only_where_the_level_adds_a_rewrite(tmp_path, policy):
    from edgebuild_coreml.stages import lower_params_of

    _mlp(tmp_path / "mlp.onnx")
    recipe = tmp_path / "mlp.yaml"
    recipe.write_text(MLP_RECIPE.format(policy=policy, variants=_levels() + "\n  plain: {}"))
    params = {name: lower_params_of(v).key_params() for name, v in _variants(recipe).items()}
    assert params["o0"] == params["o1"] == params["o2"] == params["plain"]
    rewrites = params["o3"]["compute"]["rewrites"]
    assert rewrites == ({"ane_layout": True} if policy == "cpu_and_ne" else {})
    assert (params["o3"] == params["o2"]) is (policy == "cpu_and_gpu")


def _run(recipe: Path, cache: Path, *variants: str) -> dict[str, dict]:
    """``edgebuild run --json`` in a subprocess; every variant built, as {variant: report.json}."""
    args = [a for v in variants for a in ("--variant", v)]
    done = subprocess.run([sys.executable, "-m", "edgebuild.cli.app", "run", str(recipe), *args, "--cache-dir",
                           str(cache), "--json"], capture_output=True, text=True, cwd=recipe.parent,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"), timeout=1800)
    assert done.stdout.strip(), done.stderr[-3000:]
    records = json.loads(done.stdout)["variants"]
    for record in records:
        assert record["status"] == "built", f"{record['variant']}: {record.get('error')}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, done.stderr[-3000:]
    return {r["variant"]: json.loads(Path(r["report_json"]).read_text()) for r in records}


def test_at_o3_the_layout_rewrite_runs_and_the_package_validates(tmp_path):
    _mlp(tmp_path / "mlp.onnx")
    recipe = tmp_path / "mlp.yaml"
    recipe.write_text(MLP_RECIPE.format(policy="cpu_and_ne", variants=_levels()))
    reports = _run(recipe, tmp_path / "cache", "o2", "o3")
    assert reports["o2"]["lower"]["rewrites"] == {}
    assert reports["o3"]["lower"]["rewrites"] == {"ane_layout": 2}  # both linears
    assert reports["o3"]["lower"]["op_counts"].get("linear", 0) == 2  # the lowering's own count, before it
    for report in reports.values():
        assert report["validation"]["failures"] == []


@pytest.fixture(scope="module")
def orientation(tmp_path_factory) -> tuple[Path, Path]:
    """The shipped orientation recipe (fp32: cpu_and_gpu) with a variant per level, 4 samples each,
    and the store its builds share (the source is resolved and imported once)."""
    workdir = tmp_path_factory.mktemp("orientation")
    recipe = workdir / "orientation.yaml"
    variants = "\n".join(f"  {level.lower()}: {{compute: {{policy: cpu_and_gpu}}, optimize: {{level: {level}}}}}"
                         for level in LEVELS)
    recipe.write_text(f"extends: {json.dumps(str(ROOT / 'recipes' / 'orientation.yaml'))}\n"
                      f"validate: {{samples: 4}}\nvariants:\n{variants}\noutputs: {{dir: out}}\n")
    return recipe, workdir / "cache"


# the two ends by default; O2 is every other test's build, O1 lies between
@pytest.mark.parametrize("level", ["O0", pytest.param("O1", marks=pytest.mark.slow),
                                   pytest.param("O2", marks=pytest.mark.slow), "O3"])
def test_a_shipped_model_builds_and_matches_onnxruntime_at_each_level(orientation, level):
    report = _run(*orientation, level.lower())[level.lower()]
    assert report["status"] == "built" and report["validation"]["failures"] == []
    assert report["optimize"]["level"] == level
    metrics = report["validation"]["runtimes"]["interpreter"]["metrics"]
    cosines = [m["cosine"]["min"] for m in metrics.values() if "cosine" in m]
    assert cosines and min(cosines) >= 0.99999, metrics
    ops = report["optimize"]["op_counts_after"]
    fused = "BatchNormalization" not in ops
    assert fused is (level in ("O2", "O3")), ops
