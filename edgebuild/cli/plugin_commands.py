"""The commands plugins register (``edgebuild_register_commands``), joined to the CLI when it needs them.

edgebuild's own commands never load a plugin: the registry's command table is read only when the
CLI lists its commands (``edgebuild --help``) or meets a name none of its own commands has.
"""

from __future__ import annotations

import typer
from typer.core import TyperGroup

from edgebuild.errors import PluginError
from edgebuild.first_party import provided_by


class WithPluginCommands(TyperGroup):
    """The top-level command group: edgebuild's own commands, then every plugin's on first need."""

    _plugin_commands_added = False

    def list_commands(self, ctx):
        self._add_plugin_commands()
        return super().list_commands(ctx)

    def get_command(self, ctx, cmd_name):
        if cmd_name not in self.commands:
            self._add_plugin_commands()
        return super().get_command(ctx, cmd_name)

    def resolve_command(self, ctx, args):
        try:
            return super().resolve_command(ctx, args)
        except Exception as exc:  # click's UsageError (typer may vendor its own click)
            name = args[0] if args else None
            found = provided_by("commands", name) if name and name not in self.commands else None
            if found is None or not isinstance(getattr(exc, "message", None), str):
                raise
            exc.message = f"No such command {name!r}: it is {found}"
            raise

    def _add_plugin_commands(self) -> None:
        if self._plugin_commands_added:
            return
        self._plugin_commands_added = True
        from edgebuild.registry import get_registry

        registry = get_registry()
        for name in registry.names("commands"):
            plugin = registry.plugin_of("commands", name).name
            if name in self.commands:
                raise PluginError(
                    f"plugin {plugin!r} registers command {name!r}, which is one of edgebuild's own commands",
                    hint="give the plugin's command another name, or uninstall the plugin",
                )
            self.add_command(_click_command(name, plugin, registry.get("commands", name)), name)


def _click_command(name: str, plugin: str, factory):
    """The click command for what ``factory()`` returns: a ``typer.Typer`` group or a function."""
    try:
        made = factory()
    except PluginError:
        raise
    except Exception as exc:
        raise PluginError(
            f"plugin {plugin!r} failed while making its command {name!r}: {type(exc).__name__}: {exc}",
            hint="fix or uninstall the plugin",
        ) from exc
    if isinstance(made, typer.Typer):
        command = typer.main.get_group(made)
        command.name = name
        return command
    if callable(made):
        single = typer.Typer(add_completion=False)
        single.command(name)(made)
        return typer.main.get_command(single)
    raise PluginError(
        f"plugin {plugin!r} registers command {name!r} whose factory returned {type(made).__name__}",
        hint="the factory must return a typer.Typer or a function",
    )
