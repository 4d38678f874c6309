"""Registers ``edgebuild conformance`` through the commands hook, as any plugin adds a command
(an entry point of the core distribution)."""

from __future__ import annotations

from edgebuild.hookspecs import hookimpl


@hookimpl
def edgebuild_register_commands(register):
    def conformance_command():
        from edgebuild.conformance.command import conformance

        return conformance

    register("conformance", conformance_command)
