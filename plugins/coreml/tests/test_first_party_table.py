"""The core's table of what each first-party plugin provides (edgebuild/first_party.py, for the
hints given where one is not installed) says what those plugins register. Needs every
first-party plugin installed, as the full test environment has them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from edgebuild.first_party import DISTRIBUTIONS
from edgebuild.registry import get_registry

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

KINDS = ("backends", "commands", "recipe_sections", "frontends")


@pytest.mark.parametrize("dist", DISTRIBUTIONS, ids=[d.name for d in DISTRIBUTIONS])
def test_the_table_lists_what_the_distribution_registers(dist):
    registry = get_registry().load_all()
    assert dist.name in {p.distribution for p in registry.plugins.values()}, f"{dist.name} is not installed"
    for kind in KINDS:
        registered = {name for name in registry.names(kind) if registry.plugin_of(kind, name).distribution == dist.name}
        assert registered == set(getattr(dist, kind)), f"{dist.name} {kind}"


def test_every_plugin_folder_that_provides_such_things_is_in_the_table():
    plugins = Path(__file__).resolve().parents[2]
    folders = {tomllib.loads(p.read_text())["project"]["name"]: p.parent.name for p in plugins.glob("*/pyproject.toml")}
    assert {d.name: d.folder for d in DISTRIBUTIONS}.items() <= {n: f"plugins/{f}" for n, f in folders.items()}.items()
    registry = get_registry().load_all()
    for plugin in registry.plugins.values():
        if plugin.distribution in folders and plugin.distribution not in {d.name for d in DISTRIBUTIONS}:
            # a plugin of this repository left out of the table must provide nothing the hints cover
            assert not any(plugin.registered.get(kind) for kind in KINDS), plugin.distribution
