"""Registers edgebuild-msl with edgebuild.

This plugin is a toolchain rather than a set of ops: op plugins declare their kernels with
:class:`edgebuild_msl.KernelSpec` and register them through ``edgebuild_register_custom_ops``;
edgebuild-msl checks, emulates and (on macOS) compiles them. It registers no op of its own,
only the ``edgebuild kernels`` command that checks every installed kernel.
"""

from __future__ import annotations

from edgebuild.plugin import hookimpl


@hookimpl
def edgebuild_register_commands(register):
    def kernels_command():
        from edgebuild_msl.command import kernels

        return kernels

    register("kernels", kernels_command)
