"""Registers edgebuild-mpsgraph: MPSGraph lowerings, the ``bundle`` backend, its recipe
options and the runtimes that execute MPSGraph programs and Metal kernel segments on Linux."""

from __future__ import annotations

from edgebuild.plugin import Lazy, hookimpl


@hookimpl
def edgebuild_register_lowerings(register):
    from edgebuild_mpsgraph.lowering import LOWERINGS

    LOWERINGS.register_all(register)


@hookimpl
def edgebuild_register_backends(register):
    register("bundle", Lazy("edgebuild_mpsgraph.bundle_backend:BundleBackend").known(default=False))


@hookimpl
def edgebuild_register_recipe_sections(register):
    from edgebuild_mpsgraph.options import BundleOptions

    register("bundle:target.options", BundleOptions)


@hookimpl
def edgebuild_register_runtimes(register):
    register("mpsgraph-reference", Lazy("edgebuild_mpsgraph.runtime:MPSGraphReferenceRuntime"))
    register("msl-emulation", Lazy("edgebuild_mpsgraph.runtime:MSLEmulationRuntime"))
