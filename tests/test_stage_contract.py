"""Every stage's key is the whole truth: its body reads only its typed parameters and its inputs, and
each parameter, plugin and library it depends on is in its key.

Walked over every shipped recipe whose backend is installed (recipes/*.yaml: all of them with the
first-party plugins, none in the core's own environment) and over the test plugin's recipes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from edgebuild.build.jobs import load_variants
from edgebuild.dag.keys import key_of
from edgebuild.dag.stages import pipeline
from edgebuild.registry import Registry, build_registry, get_registry
from edgebuild.stage import Stage, StageParams

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "recipes").glob("*.yaml"))


def _stages_of(recipe: Path, registry) -> list[tuple[str, list[Stage]]]:
    variants = load_variants([str(recipe)], None, registry)
    return [(f"{v.recipe.name}:{v.name}", pipeline(v, registry, lambda: None)) for v in variants]


def _installed(recipe: Path, registry) -> bool:
    import yaml

    data = yaml.safe_load(recipe.read_text()) or {}
    backend = (data.get("target") or {}).get("backend") or "coreml"
    return backend in registry.names("backends")


def _shipped_stages():
    registry = get_registry()
    found = [recipe for recipe in SHIPPED if _installed(recipe, registry)]
    if not found:
        pytest.skip("no shipped recipe's backend is installed here (the core's own environment)")
    return [(label, stage) for recipe in found for label, stages in _stages_of(recipe, registry) for stage in stages]


def _testplugin_stages(tmp_path, monkeypatch):
    import onnx
    from onnx import TensorProto, helper

    monkeypatch.chdir(tmp_path)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "tiny.onnx")
    Path("recipe.yaml").write_text(
        "edgebuild: 1\nname: tiny\nsource: {model: tiny.onnx}\ntarget: {backend: testcopy}\n"
        "validate: {samples: 2, runtimes: [testcopy]}\noutputs: {dir: out}\n"
        "variants:\n  plain: {}\n  compressed: {compression: {level: 2}}\n")
    return [(label, stage) for label, stages in _stages_of(Path("recipe.yaml"), get_registry()) for stage in stages]


def _changed(value):
    """Another value of the same kind, or None when there is no obvious one."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "-other"
    if isinstance(value, (list, tuple)):
        return type(value)(value[:-1]) if value else None  # one element fewer: no element type to guess
    if isinstance(value, dict):
        return dict(list(value.items())[:-1]) if value else None
    return None


def _one_field_changes(params: StageParams):
    """``(field, params with only that field changed)`` for every field with an obvious other value:
    a typed section's own fields count as fields too (one level down)."""
    for name, value in params:
        if isinstance(value, BaseModel):
            for inner, inner_value in value:
                other = _changed(inner_value)
                if other is not None:
                    try:
                        changed = value.model_copy(update={inner: other})
                    except Exception:  # noqa: BLE001 - a frozen or validated model: nothing to vary
                        continue
                    yield f"{name}.{inner}", params.model_copy(update={name: changed})
            continue
        other = _changed(value)
        if other is not None:
            yield name, params.model_copy(update={name: other})


def _check(label: str, stage: Stage, registry) -> None:
    where = f"{label} {stage.name}"
    if stage.resolve is not None:
        return  # the source stage stands outside the store: its digest is the file's
    assert isinstance(stage.params, StageParams), f"{where}: parameters are not typed ({type(stage.params)})"
    body = stage.body
    assert callable(body), where
    assert getattr(body, "__closure__", None) is None, f"{where}: the body closes over {body.__code__.co_freevars}"
    assert "<locals>" not in body.__qualname__ and body.__name__ != "<lambda>", f"{where}: {body.__qualname__}"
    assert not hasattr(body, "__self__"), f"{where}: a bound method can read its object's state"
    digests = {d: "0" * 64 for d in stage.deps}
    key = key_of(stage, digests)
    judging = getattr(stage.params, "judging", ())
    assert not judging or stage.judge is not None, f"{where}: fields {judging} judge, but nothing judges"
    for field, changed in _one_field_changes(stage.params):
        other = Stage(stage.name, changed, stage.deps, stage.body, plugins=stage.plugins,
                      libraries_versions=stage.libraries_versions)
        if field in judging:  # read by the stage's judge only, after the body: a change reruns nothing
            assert key_of(other, digests) == key, f"{where}: changing {field}, which only judges, changes the key"
        else:
            assert key_of(other, digests) != key, f"{where}: changing {field} leaves the key as it is"
    for kind in stage.uses:
        assert kind in ("frontends", "passes", "lowerings", "backends", "runtimes", "custom_ops", "resolvers"), where
        for info in registry.plugins.values():
            if info.registered.get(kind):
                assert stage.plugins.get(info.distribution or info.name) == info.version, \
                    f"{where}: plugin {info.name} registered {kind} but is not in the key"
    for library in stage.libraries:
        from edgebuild.versions import library_versions

        assert stage.libraries_versions.get(library) == library_versions([library]).get(library), where


def test_every_shipped_recipes_stages_keep_the_contract():
    assert SHIPPED, "recipes/*.yaml: the walk would check nothing"
    registry = get_registry()
    for label, stage in _shipped_stages():
        _check(label, stage, registry)


def test_the_test_plugins_stages_keep_the_contract(tmp_path, monkeypatch):
    stages = _testplugin_stages(tmp_path, monkeypatch)
    assert {stage.name for _, stage in stages} >= {"import", "optimize", "lower", "compress", "package", "validate"}
    for label, stage in stages:
        _check(label, stage, get_registry())


def test_a_body_closing_over_the_recipe_is_caught():
    recipe = {"precision": "float16"}

    def reads_the_recipe(params, inputs, out):
        return {"precision": recipe["precision"]}

    class Nothing(StageParams):
        pass

    with pytest.raises(AssertionError, match="closes over"):
        _check("t:v", Stage("lower", Nothing(), [], reads_the_recipe), Registry())


def test_a_plugin_registering_only_a_command_is_in_no_key(tmp_path, monkeypatch):
    class Greeter:
        from edgebuild.hookspecs import hookimpl

        @staticmethod
        @hookimpl
        def edgebuild_register_commands(register):
            register("greet", lambda: (lambda: None))

    registry = build_registry({"greeter": Greeter()})
    import onnx
    from onnx import TensorProto, helper

    monkeypatch.chdir(tmp_path)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "tiny.onnx")
    Path("recipe.yaml").write_text("edgebuild: 1\nname: tiny\nsource: {model: tiny.onnx}\n"
                                   "target: {backend: testcopy}\noutputs: {dir: out}\n")
    with_greeter = _stages_of(Path("recipe.yaml"), registry)[0][1]
    without = _stages_of(Path("recipe.yaml"), build_registry())[0][1]
    assert "greet" in registry.names("commands") and registry.plugins["greeter"].registered == {"commands": ["greet"]}
    for mine, theirs in zip(with_greeter, without):
        assert "greeter" not in mine.plugins
        assert mine.plugins == theirs.plugins, mine.name
