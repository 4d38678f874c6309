"""Plugin discovery through entry points, register callbacks, and clear errors on clashes."""

from __future__ import annotations

import json
import types

import pytest

from edgebuild_testplugin.cli_runner import edgebuild
from edgebuild_testplugin.imports import imported_by
from edgebuild.errors import PluginError
from edgebuild.hookspecs import hookimpl
from edgebuild.registry import build_registry


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
