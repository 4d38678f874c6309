"""Fixtures for edgebuild's tests and its plugins' tests, loaded by pytest through the
``pytest11`` entry point wherever this distribution is installed."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A directory with tiny.onnx and a recipe using the test plugin's backend: ``project(extra)``
    writes the recipe (``extra``: more YAML sections) and returns its path."""
    from edgebuild_testplugin.models import tiny_model
    from edgebuild_testplugin.recipes import RECIPE

    tiny_model(tmp_path / "tiny.onnx")
    monkeypatch.setenv("EDGEBUILD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("EDGEBUILD_TEST_LOG", str(tmp_path / "log.txt"))
    monkeypatch.chdir(tmp_path)

    def write(extra: str = "", name: str = "recipe.yaml") -> Path:
        path = tmp_path / name
        path.write_text(RECIPE.format(extra=extra))
        return path

    return write


@pytest.fixture
def cli(capsys):
    """``cli(*args)``: ``edgebuild ARGS`` in this process -> (exit code, stdout, stderr)."""
    from edgebuild_testplugin.cli_runner import run_in_process

    return lambda *args: run_in_process(capsys, *args)


@pytest.fixture
def core_plugins_only(monkeypatch):
    """The process-wide registry as an install of the core alone has it: the core's plugins and
    the test plugin's, none of plugins/ (whether or not they are installed here)."""
    from importlib.metadata import entry_points

    import pluggy

    import edgebuild.registry as registry_module
    from edgebuild import hookspecs

    pm = pluggy.PluginManager("edgebuild")
    pm.add_hookspecs(hookspecs)
    dists = {}
    for ep in entry_points(group="edgebuild"):
        if ep.dist is not None and ep.dist.name in ("edgebuild", "edgebuild-testplugin"):
            pm.register(ep.load(), name=ep.name)
            dists[ep.name] = (ep.dist.name, ep.dist.version)
    registry = registry_module.Registry()
    registry.collect(pm, dists)
    monkeypatch.setattr(registry_module, "_REGISTRY", registry)
    return registry
