"""Plugin discovery through entry points, register callbacks, and clear errors on clashes."""

from __future__ import annotations

import json
import types

import pluggy
import pytest

from edgebuild_testplugin.cli_runner import edgebuild
from edgebuild_testplugin.imports import imported_by
from edgebuild import hookspecs
from edgebuild.errors import PluginError, UsageError
from edgebuild.hookspecs import hookimpl
from edgebuild.protocols import Backend
from edgebuild.registry import Registry, build_registry


def test_test_plugin_distribution_is_discovered():
    done = edgebuild("plugins", "--json", check=0)
    plugins = {p["name"]: p for p in json.loads(done.stdout)["plugins"]}
    test = plugins["testplugin"]
    assert test["distribution"] == "edgebuild-testplugin"
    assert test["version"].startswith("0.0.1+src.")  # installed editable: its sources are part of it
    assert test["registered"]["backends"] == ["testcopy"]
    assert plugins["core"]["registered"]["resolvers"] == ["file", "pypi", "https"]


def _plugin(**hooks):
    module = types.ModuleType("fake")
    for name, fn in hooks.items():
        setattr(module, name, hookimpl(fn))
    return module


def test_a_name_held_by_another_plugin_is_an_error_naming_both():
    clash = _plugin(edgebuild_register_backends=lambda register: register("testcopy", object()))
    registry = build_registry({"clashing": clash})
    with pytest.raises(PluginError, match="plugin 'clashing' registers backend 'testcopy', which plugin 'testplugin' already holds"):
        registry.get("backends", "testcopy")


def test_overlapping_lowering_ranges_are_an_error():
    def register_relu(register):
        register("testcopy", "Relu", lambda ctx, node: None, since=1)

    registry = build_registry({"first": _plugin(edgebuild_register_lowerings=register_relu),
                               "dup": _plugin(edgebuild_register_lowerings=register_relu)})
    with pytest.raises(PluginError, match="plugin 'dup' registers a testcopy lowering of Relu .* overlapping the one plugin 'first' holds"):
        registry.lowering("testcopy", "Relu", "", 17)


def test_a_plugin_that_fails_while_registering_is_named():
    def broken(register):
        raise RuntimeError("no GPU here")

    registry = build_registry({"broken": _plugin(edgebuild_register_passes=broken)})
    with pytest.raises(PluginError, match="plugin 'broken' .* failed while registering passes: RuntimeError: no GPU here"):
        registry.names("passes")


def test_a_plugin_that_fails_to_import_is_a_clear_cli_error(tmp_path):
    dist = tmp_path / "badplugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: badplugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[edgebuild]\nbad = badplugin_missing_module\n")
    done = edgebuild("plugins", env={"PYTHONPATH": str(tmp_path)})
    assert done.returncode == 1
    assert "plugin 'bad' (distribution badplugin 0.1) failed to import" in done.stderr
    assert "pip uninstall badplugin" in done.stderr and "Traceback" not in done.stderr


def test_lazy_tables_keep_registration_cheap():
    # building a registry and listing backends must not import onnx (a backend's own libraries: its tests)
    code = ("from edgebuild.registry import get_registry; r = get_registry(); "
            "r.get('backends', 'testcopy'); r.names('passes'); r.get('frontends', 'onnx')")
    assert imported_by(code, ("coremltools", "onnx", "onnxscript", "torch")) == []


class _Backend(Backend):
    def __init__(self, default: bool = False):
        self.default = default

    def stages(self, variant, registry, plugins):
        return []


def _only(**backends) -> Registry:
    """A registry of these backends alone, one plugin each (no installed entry point)."""
    pm = pluggy.PluginManager("edgebuild")
    pm.add_hookspecs(hookspecs)
    for name, backend in backends.items():
        pm.register(_plugin(edgebuild_register_backends=lambda register, n=name, b=backend: register(n, b)),
                    name=f"{name}_plugin")
    registry = Registry()
    registry.collect(pm, {})
    return registry


def test_the_default_backend_is_the_one_that_says_so_or_the_only_one():
    assert _only(a=_Backend(), b=_Backend(default=True)).default_backend() == "b"
    assert _only(a=_Backend()).default_backend() == "a"
    with pytest.raises(UsageError, match="no installed backend is the default; there are 2: a, b"):
        _only(a=_Backend(), b=_Backend()).default_backend()
    with pytest.raises(PluginError, match="'a' \\(plugin 'a_plugin'\\), 'b' \\(plugin 'b_plugin'\\) each claim"):
        _only(a=_Backend(default=True), b=_Backend(default=True)).default_backend()


def test_a_plugin_object_missing_a_protocol_member_is_named_when_loaded():
    class Incomplete:  # a backend that neither subclasses Backend nor defines its members
        def stages(self, variant, registry, plugins):
            return []

    with pytest.raises(PluginError, match=r"registers backend 'a' without artifact, candidates, check_recipe, .*edgebuild.protocols.Backend"):
        _only(a=Incomplete()).get("backends", "a")


def test_a_lazy_plugin_object_is_checked_when_it_first_loads_not_before():
    from edgebuild.plugin import Lazy

    lazy = Lazy("builtins:object")
    registry = _only(a=lazy)
    registry.names("backends")  # registering imports nothing and checks nothing yet
    with pytest.raises(PluginError, match="registers backend 'a' without"):
        lazy.stages


class _DefaultBackend(Backend):
    default = True

    def stages(self, variant, registry):
        return []


class _OtherBackend(_DefaultBackend):
    default = False


def test_the_default_backend_is_picked_from_what_registrations_say_without_importing_them():
    from edgebuild.plugin import Lazy

    default = Lazy(f"{__name__}:_DefaultBackend").known(default=True)
    other = Lazy(f"{__name__}:_OtherBackend").known(default=False)
    assert _only(a=other, b=default).default_backend() == "b"
    assert default._obj is None and other._obj is None  # neither was made


def test_a_registration_that_says_other_than_its_object_is_named_when_it_loads():
    from edgebuild.plugin import Lazy

    wrong = Lazy(f"{__name__}:_OtherBackend").known(default=True)
    registry = _only(a=wrong)
    with pytest.raises(PluginError, match=r"registers backend 'a' as having default=True, but it has default=False"):
        registry.get("backends", "a").stages


def test_a_recipe_section_that_is_not_a_recipe_section_model_is_refused_when_registered():
    from pydantic import BaseModel

    class Plain(BaseModel):  # a pydantic model, but not derived from edgebuild.protocols.RecipeSection
        level: int = 1

    pm = pluggy.PluginManager("edgebuild")
    pm.add_hookspecs(hookspecs)
    pm.register(_plugin(edgebuild_register_recipe_sections=lambda register: register("x:compression", Plain)),
                name="x_plugin")
    registry = Registry()
    registry.collect(pm, {})
    with pytest.raises(PluginError, match="'x:compression' with .*Plain.*not a subclass of edgebuild.protocols.RecipeSection"):
        registry.names("recipe_sections")
