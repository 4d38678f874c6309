"""Plugin commands (``edgebuild_register_commands``): listed in ``--help``, run like edgebuild's own,
and a name someone else holds is an error naming both."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from edgebuild_testplugin.cli_runner import edgebuild
from edgebuild.errors import PluginError
from edgebuild.registry import build_registry
from test_registry import _plugin

GREETINGS = '''
import typer
from edgebuild.hookspecs import hookimpl


def hello(name: str = typer.Option("world", "--name", help="whom to greet")):
    """Say hello."""
    typer.echo(f"hello {name}")


def greet():
    group = typer.Typer(help="Greetings in two tones.")

    @group.command()
    def loud():
        typer.echo("HELLO")

    @group.command()
    def soft():
        typer.echo("hello")

    return group


@hookimpl
def edgebuild_register_commands(register):
    register("hello", lambda: hello)
    register("greet", greet)
'''

CLASHING = '''
from edgebuild.hookspecs import hookimpl


@hookimpl
def edgebuild_register_commands(register):
    register("run", lambda: lambda: None)
'''


def install(site: Path, name: str, source: str) -> dict[str, str]:
    """A distribution ``name`` whose ``edgebuild`` entry point is a module holding ``source``;
    the environment that makes it importable."""
    (site / name).mkdir(parents=True)
    (site / name / "__init__.py").write_text(textwrap.dedent(source))
    info = site / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[edgebuild]\n{name} = {name}\n")
    return {"PYTHONPATH": str(site)}


def test_a_plugin_command_is_listed_in_help_and_runs(tmp_path):
    env = install(tmp_path / "site", "greetings", GREETINGS)
    listed = edgebuild("--help", env=env, check=0).stdout
    assert "hello" in listed and "Say hello." in listed
    assert "greet" in listed and "Greetings in two tones." in listed
    assert edgebuild("hello", "--name", "you", env=env, check=0).stdout == "hello you\n"
    assert edgebuild("greet", "loud", env=env, check=0).stdout == "HELLO\n"
    assert "whom to greet" in edgebuild("hello", "--help", env=env, check=0).stdout


def _registers_hello(register):
    register("hello", lambda: lambda: None)


def test_registered_commands_are_listed_with_their_plugin():
    registry = build_registry({"greetings": _plugin(edgebuild_register_commands=_registers_hello)})
    assert "hello" in registry.names("commands")
    assert registry.plugins["greetings"].registered["commands"] == ["hello"]
    assert registry.plugin_of("commands", "conformance").distribution == "edgebuild"  # the core's own, so registered


def test_a_command_name_held_by_another_plugin_is_an_error_naming_both():
    registry = build_registry({"first": _plugin(edgebuild_register_commands=_registers_hello),
                               "second": _plugin(edgebuild_register_commands=_registers_hello)})
    with pytest.raises(PluginError, match="plugin 'second' registers command 'hello', which plugin 'first' already holds"):
        registry.names("commands")


def test_a_command_name_held_by_edgebuild_is_an_error_naming_both(tmp_path):
    env = install(tmp_path / "site", "clashing", CLASHING)
    done = edgebuild("--help", env=env, check=1)
    assert "plugin 'clashing' registers command 'run', which is one of edgebuild's own commands" in done.stderr
    assert "Traceback" not in done.stderr
    # edgebuild's own commands never load plugin commands: a broken plugin does not lock the store away
    assert edgebuild("cache", "info", "--json", env=env, check=0).stdout.startswith("{")
