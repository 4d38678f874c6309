"""``optimize.level``: which passes and onnxscript rules run at O0..O3, that O2 is the build of a
recipe naming no level, that a pass switch wins over the level, that each level has its own key,
and that a bad level is refused at its file:line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgebuild.errors import PluginError
from edgebuild.graph import core_plugin
from edgebuild.graph.folding import default_rules, fold_and_clean, is_fusion_rule, rules_at, simplification_rules
from edgebuild.graph.level_docs import PAGE, page_with_table
from edgebuild.graph.optimize import keep_weight_transposes, optimize
from edgebuild.recipe.model import OPTIMIZE_LEVELS
from edgebuild.recipe.passes import pass_level, pass_switches, passes_by_level, runs_at
from edgebuild.registration import Lazy
from edgebuild.registry import get_registry
from edgebuild.report.html import render_report
from edgebuild_testplugin.cli_runner import assert_usage_error
from edgebuild_testplugin.models import tiny_model
from edgebuild_testplugin.recipes import BASE_RECIPE


def _conv_model(path: Path) -> Path:
    """Conv -> BatchNormalization -> Transpose -> Transpose back -> Relu -> Reshape to the shape
    ``Shape`` computes -> MatMul + Add: something for folding (the shape), for a simplification
    rule (the Transpose pair), for onnxscript's BatchNorm fusion and for ``fuse_bias``."""
    rng = np.random.default_rng(0)
    weights = {
        "w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "cb": rng.standard_normal(4).astype(np.float32),
        "scale": rng.uniform(0.5, 1.5, 4).astype(np.float32), "bias": rng.standard_normal(4).astype(np.float32),
        "mean": rng.standard_normal(4).astype(np.float32), "var": rng.uniform(0.5, 1.5, 4).astype(np.float32),
        "fc": rng.standard_normal((4 * 6 * 6, 5)).astype(np.float32), "fb": rng.standard_normal(5).astype(np.float32),
        "first": np.array([0], dtype=np.int64), "flat": np.array([-1], dtype=np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w", "cb"], ["c"]),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["n"]),
        helper.make_node("Transpose", ["n"], ["t"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["t"], ["u"], perm=[0, 3, 1, 2]),
        helper.make_node("Relu", ["u"], ["r"]),
        helper.make_node("Shape", ["r"], ["s"]),
        helper.make_node("Gather", ["s", "first"], ["batch"], axis=0),
        helper.make_node("Concat", ["batch", "flat"], ["target"], axis=0),
        helper.make_node("Reshape", ["r", "target"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["m"]),
        helper.make_node("Add", ["m", "fb"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "levels", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.fixture(scope="module")
def conv_model(tmp_path_factory) -> Path:
    return _conv_model(tmp_path_factory.mktemp("levels") / "model.onnx")


@pytest.fixture(scope="module")
def reports(conv_model, tmp_path_factory) -> dict[str, dict]:
    """The optimize report of ``conv_model`` at each level (and with no level), and its op counts."""
    out = tmp_path_factory.mktemp("optimized")
    made = {level: optimize(conv_model, out / level, level=level) for level in OPTIMIZE_LEVELS}
    made[None] = optimize(conv_model, out / "none")
    return made


def _cumulative(registry, level: str) -> list[str]:
    by_level = passes_by_level(registry)
    starts = {name: start for start, names in by_level.items() for name in names}
    return [name for name in registry.names("passes") if OPTIMIZE_LEVELS.index(starts[name]) <= OPTIMIZE_LEVELS.index(level)]


@pytest.mark.parametrize("level", OPTIMIZE_LEVELS)
def test_each_level_runs_every_pass_of_its_level_and_below_and_no_other(reports, level):
    report = reports[level]
    assert report["level"] == level
    assert sorted(report["rules"]) == sorted(_cumulative(get_registry(), level))  # in the order they ran


def test_what_the_levels_change_in_a_model(reports):
    ops = {level: reports[level]["op_counts_after"] for level in OPTIMIZE_LEVELS}
    for level in OPTIMIZE_LEVELS:  # folding at every level: the Reshape's shape is a constant
        assert "Shape" not in ops[level] and "Concat" not in ops[level], (level, ops[level])
    assert ops["O0"]["Transpose"] == 2 and ops["O0"]["BatchNormalization"] == 1  # no rule at all
    assert "Transpose" not in ops["O1"] and ops["O1"]["BatchNormalization"] == 1  # simplified, not fused
    assert "edgebuild::Linear" not in ops["O1"] and ops["O1"]["MatMul"] == 1
    for level in ("O2", "O3"):  # onnxscript's BatchNorm fusion and fuse_bias
        assert "BatchNormalization" not in ops[level] and "Transpose" not in ops[level]
        assert ops[level].get("edgebuild::Linear") == 1 and "MatMul" not in ops[level]
    assert reports["O2"]["rules"]["fuse_bias"] >= 1 and reports["O1"]["rules"] == reports["O0"]["rules"]
    nodes = [reports[level]["nodes_after"] for level in OPTIMIZE_LEVELS]
    assert nodes[0] > nodes[1] > nodes[2] == nodes[3], nodes


def test_level_o2_writes_the_bytes_a_call_without_a_level_writes(conv_model, tmp_path):
    made = {}
    for level in ("O2", None, "O0"):
        out = tmp_path / str(level)
        optimize(conv_model, out, **({"level": level} if level else {}))
        made[level] = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    assert "model.onnx" in made["O2"]
    assert made["O2"] == made[None]
    assert made["O0"]["model.onnx"] != made["O2"]["model.onnx"]  # the comparison can fail


def test_level_o2_is_the_optimize_stage_as_it_was_before_levels(conv_model):
    """At O2 the folding is onnxscript's ``optimize_ir`` itself, and every pass is on exactly when
    its ``default`` says: what the stage did before a level existed."""
    import onnxscript.optimizer

    from edgebuild.graph.rule_matching import tried_at_their_first_op

    by_stage, by_hand = ir.load(conv_model), ir.load(conv_model)
    fold_and_clean(by_stage, "O2", should_fold=keep_weight_transposes)
    with tried_at_their_first_op(default_rules()):
        onnxscript.optimizer.optimize_ir(by_hand, should_fold=keep_weight_transposes)
    assert ir.serde.serialize_model(by_stage).SerializeToString() == ir.serde.serialize_model(by_hand).SerializeToString()
    registry = get_registry()
    assert pass_switches({}, registry, "O2") == pass_switches({}, registry)
    assert pass_switches({}, registry) == {name: bool(entry.obj.default) for name, entry in registry.tables["passes"].items()}


def test_the_rule_sets_of_the_levels():
    rules = {level: rules_at(level) for level in OPTIMIZE_LEVELS}
    assert rules["O0"] == () and rules["O2"] == rules["O3"] == default_rules()
    assert rules["O1"] == simplification_rules() and set(rules["O1"]) < set(rules["O2"])
    fusions = [rule for rule in default_rules() if is_fusion_rule(rule)]
    assert fusions and not any(is_fusion_rule(rule) for rule in rules["O1"])
    assert {rule.name for rule in fusions} >= {"FuseBatchNormIntoConv", "FuseConvPad"}


@pytest.mark.parametrize("level", OPTIMIZE_LEVELS)
def test_a_switch_wins_over_the_level_both_ways(conv_model, tmp_path, level):
    registry = get_registry()
    on_by_level = pass_switches({}, registry, level)
    flipped = {name: not on for name, on in on_by_level.items() if name in ("fuse_bias", "test_noop", "dequantize_weights")}
    switched = pass_switches(flipped, registry, level)
    assert all(switched[name] is flip for name, flip in flipped.items())
    assert {n: on for n, on in switched.items() if n not in flipped} == {n: on for n, on in on_by_level.items()
                                                                          if n not in flipped}
    report = optimize(conv_model, tmp_path / "out", passes=flipped, level=level)
    assert ("fuse_bias" in report["rules"]) is switched["fuse_bias"]
    assert ("test_noop" in report["rules"]) is switched["test_noop"]


class _Declared:
    description = "a pass for the level table"
    before_folding = False

    def __init__(self, level=None, default=True):
        self.level, self.default = level, default

    def apply(self, model) -> int:
        return 0


@pytest.mark.parametrize("declared", OPTIMIZE_LEVELS)
@pytest.mark.parametrize("default", [True, False])
def test_a_declared_level_decides_whatever_the_default_says(declared, default):
    graph_pass = _Declared(declared, default)
    assert pass_level(graph_pass) == declared
    assert [runs_at(graph_pass, level) for level in OPTIMIZE_LEVELS] == [
        OPTIMIZE_LEVELS.index(declared) <= i for i in range(len(OPTIMIZE_LEVELS))]


@pytest.mark.parametrize("default, level", [(True, "O2"), (False, "O3")])
def test_a_pass_without_a_level_keeps_what_its_default_meant(default, level):
    assert pass_level(_Declared(None, default)) == level
    # a lazy registration is asked only what it said: the target is never imported
    lazy = Lazy("no_such_module_anywhere:Pass").known(default=default)
    assert pass_level(lazy) == level
    assert pass_level(Lazy("no_such_module_anywhere:Pass").known(default=default, level="O1")) == "O1"


def test_a_level_that_is_not_one_is_a_plugin_error_naming_the_pass():
    with pytest.raises(PluginError, match="graph pass 'odd' declares level 'O9', not one of O0, O1, O2, O3"):
        pass_level(_Declared("O9"), "odd")


def test_every_core_pass_carries_the_level_its_registration_says():
    registry = get_registry()
    for name, (level, before_folding) in core_plugin.PASSES.items():
        entry = registry.tables["passes"][name]
        assert entry.obj.known_attributes()["level"] == level
        assert entry.obj.level == level and entry.obj.before_folding is before_folding  # loads it: checked
        assert entry.obj.default is (level != "O3")


def test_the_docs_table_is_current():
    text = PAGE.read_text()
    assert page_with_table(text) == text, "run python -m edgebuild.graph.level_docs"
    for names in passes_by_level(get_registry()).values():
        for name in names:
            if name in core_plugin.PASSES:
                assert f"`{name}`" in text


# -- through a recipe -------------------------------------------------------------------------------

def _run(cli, recipe: Path) -> dict:
    code, out, err = cli("run", str(recipe), "--json")
    assert code == 0, err
    return json.loads(out)


def _variant(data: dict, name: str) -> dict:
    return next(v for v in data["variants"] if v["variant"] == name)


def test_each_level_has_its_own_key_and_o2_is_a_recipe_without_one(project, cli, tmp_path):
    levels = "\n".join(f"  {level.lower()}: {{optimize: {{level: {level}}}}}" for level in OPTIMIZE_LEVELS)
    data = _run(cli, project(f"variants:\n  plain: {{}}\n{levels}"))
    keys = {v["variant"]: {s["name"]: s["key"] for s in v["stages"]} for v in data["variants"]}
    optimize_keys = {name: stage_keys["optimize"] for name, stage_keys in keys.items()}
    assert len({optimize_keys[level.lower()] for level in OPTIMIZE_LEVELS}) == len(OPTIMIZE_LEVELS)
    # the same stages, so the same artifact (the test backend's package stage names its variant)
    assert {k: v for k, v in keys["plain"].items() if k != "package"} == \
        {k: v for k, v in keys["o2"].items() if k != "package"}
    for level in OPTIMIZE_LEVELS:
        report = json.loads(Path(_variant(data, level.lower())["report_json"]).read_text())
        assert report["optimize"]["level"] == level
        assert f"optimize.level <b>{level}</b>" in render_report(report)
    plain = Path(_variant(data, "plain")["artifacts"][0])
    o2 = Path(_variant(data, "o2")["artifacts"][0])
    files = sorted(p.relative_to(plain) for p in plain.rglob("*") if p.is_file())
    assert files and files == sorted(p.relative_to(o2) for p in o2.rglob("*") if p.is_file())
    assert all((plain / f).read_bytes() == (o2 / f).read_bytes() for f in files)


def test_a_level_that_does_not_exist_is_refused_at_its_line_with_the_allowed_values(tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    tiny_model(tmp_path / "m.onnx")
    for bad, column in (("O4", 19), ("o2", 19), ("3", 19)):
        Path("recipe.yaml").write_text(BASE_RECIPE + f"optimize: {{level: {bad}}}\n")
        code, out, err = cli("validate", "recipe.yaml")
        assert_usage_error(code, err, f"recipe.yaml:8:{column}", "optimize.level: must be one of O0, O1, O2, O3")
        assert out == ""
