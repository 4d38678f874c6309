"""The public plugin API holds: every name it exports imports and is documented, plugins are held
to it by import-linter, a registered object that leaves a protocol member undefined fails naming
it, and ``edgebuild plugins`` shows long names whole."""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
from pathlib import Path

import pytest

import edgebuild
import edgebuild.plugin
from edgebuild.errors import PluginError
from edgebuild.hookspecs import hookimpl
from edgebuild.plugin import Backend, Frontend, GraphPass, Lazy, Runtime
from edgebuild.protocols import missing_members
from edgebuild.registry import build_registry

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = "Plugins import only the public plugin API"


def _public_modules() -> list[str]:
    return ["edgebuild.plugin", *(f"edgebuild.plugin.{m.name}" for m in pkgutil.iter_modules(edgebuild.plugin.__path__)
                                  if not m.name.startswith("_"))]


def _public_names() -> list[tuple[str, str]]:
    return [(module, name) for module in _public_modules() for name in importlib.import_module(module).__all__]


@pytest.mark.parametrize("module", _public_modules())
def test_every_exported_name_imports(module):
    imported = importlib.import_module(module)
    assert imported.__all__, f"{module} declares no __all__"
    assert len(set(imported.__all__)) == len(imported.__all__), f"{module}.__all__ repeats a name"
    for name in imported.__all__:
        exec(f"from {module} import {name}", {})  # noqa: S102 - the import a plugin writes


def test_the_facade_declares_every_submodule_in_its_docstring():
    for module in _public_modules()[1:]:
        assert f":mod:`{module}`" in edgebuild.plugin.__doc__, f"edgebuild.plugin's docstring does not list {module}"


def test_plugins_are_forbidden_every_core_module_but_the_plugin_api():
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["name"].startswith(CONTRACT)]
    core = {f"edgebuild.{m.name}" for m in pkgutil.iter_modules(edgebuild.__path__) if m.name != "plugin"}
    forbidden = set(contract["forbidden_modules"])
    assert not core - forbidden, f"add to the contract's forbidden_modules: {sorted(core - forbidden)}"
    assert not forbidden - core, f"no such core module (drop it from forbidden_modules): {sorted(forbidden - core)}"
    plugins = {p.name.replace("-", "_") for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").exists()}
    assert {f"edgebuild_{name}" for name in plugins} <= set(contract["source_modules"])


def test_the_plugin_guide_names_every_public_name():
    guide = (ROOT / "docs" / "plugins.md").read_text()
    absent = [f"{module}.{name}" for module, name in _public_names()
              if not re.search(rf"(?<!\w){re.escape(name)}(?!\w)", guide)]
    assert not absent, f"docs/plugins.md does not name {', '.join(absent)}"


def test_the_plugin_guide_names_every_public_module():
    guide = (ROOT / "docs" / "plugins.md").read_text()
    assert [m for m in _public_modules() if f"`{m}`" not in guide] == []


# -- a protocol member left undefined -------------------------------------------------------------

class NoApply(GraphPass):  # inherits GraphPass.apply, which only declares the method
    description = "forgets apply"


class WithApply(GraphPass):
    def apply(self, model) -> int:
        return 0


class Plugin:
    """A plugin module's hooks, as an object, registering ``passes``."""

    def __init__(self, **passes):
        self.passes = passes

    @hookimpl
    def edgebuild_register_passes(self, register):
        for name, obj in self.passes.items():
            register(name, obj)


def test_a_pass_without_apply_fails_at_registration_naming_the_member():
    registry = build_registry({"forgetful": Plugin(fuse_nothing=NoApply())})
    with pytest.raises(PluginError) as raised:
        registry.get("passes", "fuse_nothing")
    assert str(raised.value.message) == ("plugin 'forgetful' registers pass 'fuse_nothing' without apply "
                                         "(edgebuild.protocols.GraphPass)")
    assert "define apply in NoApply" in raised.value.hint


def test_a_lazy_pass_without_apply_fails_when_first_used_not_with_a_type_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "forgetful_plugin", type(sys)("forgetful_plugin"))
    sys.modules["forgetful_plugin"].NoApply = NoApply
    registry = build_registry({"forgetful": Plugin(fuse_nothing=Lazy("forgetful_plugin:NoApply").known(default=True))})
    lazy = registry.get("passes", "fuse_nothing")
    assert lazy.default is True  # answered without loading it
    with pytest.raises(PluginError, match=r"registers pass 'fuse_nothing' without apply \(edgebuild.protocols.GraphPass\)"):
        lazy.apply(None)


def test_only_members_without_a_body_are_required():
    assert missing_members(NoApply(), GraphPass) == ["apply"]
    assert missing_members(WithApply(), GraphPass) == []  # description, default, before_folding: values

    class Importer(Frontend):  # option_files, reference, ...: defaults with a body
        def import_model(self, path, inputs, out_dir, *, options=None, base_dir=None):
            return {}

    assert missing_members(Importer(), Frontend) == []

    class HalfRuntime(Runtime):
        name = "half"

        def run(self, artifact, inputs):
            return {}

    assert missing_members(HalfRuntime(), Runtime) == ["can_run"]


def test_a_member_defined_as_a_stub_by_the_plugin_itself_counts_as_defined():
    """Only the protocol's own declaration is missing: a plugin's method with a docstring body is its choice."""

    class Quiet(GraphPass):
        def apply(self, model) -> int:
            """Rewrites nothing (returns None: the plugin's own business)."""

    assert missing_members(Quiet(), GraphPass) == []


def test_a_backend_without_stages_is_named():
    class Incomplete(Backend):
        artifact = "model.bin"

    assert "stages" in missing_members(Incomplete(), Backend)


# -- edgebuild plugins ------------------------------------------------------------------------

LONG_PLUGIN = "a_plugin_whose_distribution_name_is_long_enough_to_be_cut_in_a_table"
LONG_PASS = "fuse_a_pattern_with_an_unusually_long_and_descriptive_name_for_the_list"


def test_the_plugin_list_shows_long_names_whole_at_80_columns(monkeypatch, capsys):
    from edgebuild.cli import app

    registry = build_registry({LONG_PLUGIN: Plugin(**{LONG_PASS: WithApply()})})
    monkeypatch.setattr(app, "_registry", lambda: registry)
    monkeypatch.setenv("COLUMNS", "80")
    app.plugins(as_json=False)
    shown = capsys.readouterr().out
    assert LONG_PLUGIN in shown and LONG_PASS in shown
    assert "…" not in shown
    assert max(len(line.rstrip()) for line in shown.splitlines()) <= 80
