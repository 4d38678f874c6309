"""Registers the StableHLO frontend with edgebuild, through the same hooks a third party uses.

Nothing here imports jax: the frontend is a ``Lazy`` stand-in until a build uses it.
"""

from __future__ import annotations

from edgebuild.plugin import Lazy, hookimpl

# What decides the imported model and judges it: jax exports and runs the source (the reference),
# jaxlib's MLIR bindings read it, onnx-ir holds what the converters write.
LIBRARIES = ("jax", "jaxlib", "onnx-ir")


@hookimpl
def edgebuild_register_frontends(register):
    register("stablehlo", Lazy("edgebuild_jax.frontend:StableHLOFrontend").known(libraries=LIBRARIES))


@hookimpl
def edgebuild_register_recipe_sections(register):
    from edgebuild_jax.options import StableHLOOptions

    register("stablehlo:source.options", StableHLOOptions)


@hookimpl
def edgebuild_register_conformance_suites(register):
    def stablehlo_cases(ops):
        from edgebuild_jax.conformance import collect_cases

        return collect_cases(ops)

    register("stablehlo", stablehlo_cases)
