"""The hooks edgebuild calls; the entry point ``example_ops`` names this module."""

from __future__ import annotations

from edgebuild.hookspecs import hookimpl

from edgebuild_example_ops import DOMAIN, OP_TYPE


@hookimpl
def edgebuild_register_custom_ops(register):
    """The op itself: schema, numpy reference and Metal kernel travel in one KernelSpec."""
    from edgebuild_example_ops.kernel import rms_norm_kernel
    from edgebuild_example_ops.schema import register_schema

    register_schema()
    register(DOMAIN, OP_TYPE, rms_norm_kernel())


@hookimpl
def edgebuild_register_lowerings(register):
    """Core ML: a decomposition into MIL ops. Imported lazily (coremltools is heavy and optional)."""

    def lower_rms_norm(ctx, node):
        from edgebuild_example_ops.coreml import lower_rms_norm as lower

        return lower(ctx, node)

    register("coreml", OP_TYPE, lower_rms_norm, domain=DOMAIN)
