"""The hooks edgebuild calls; the entry point ``example_ops`` names this module.

The plugin needs only edgebuild and onnx: the Core ML lowering runs where edgebuild-coreml is
installed (it imports coremltools when something lowers), and the Metal kernel is the ``[msl]``
extra. Without edgebuild-msl the op is registered by its numpy reference alone, which is all
validation needs.
"""

from __future__ import annotations

from edgebuild.plugin import Lazy, OpReference, hookimpl

from edgebuild_example_ops import DOMAIN, OP_TYPE


def has_kernel_sdk() -> bool:
    """Whether edgebuild-msl (the ``[msl]`` extra) is installed, so the Metal kernel can be declared."""
    try:
        import edgebuild_msl  # noqa: F401
    except ImportError:
        return False
    return True


@hookimpl
def edgebuild_register_custom_ops(register):
    """The op itself: with edgebuild-msl, its Metal kernel (which carries the schema and the reference);
    without, its reference alone."""
    from edgebuild_example_ops.reference import rms_norm
    from edgebuild_example_ops.schema import register_schema

    register_schema()
    if has_kernel_sdk():
        from edgebuild_example_ops.kernel import rms_norm_kernel

        register(DOMAIN, OP_TYPE, rms_norm_kernel())
    else:
        register(DOMAIN, OP_TYPE, OpReference(DOMAIN, OP_TYPE, reference=rms_norm, inputs=("X", "scale"),
                                              outputs=("Y",), attributes={"epsilon": 1e-6},
                                              description="RMS normalisation over the last axis"))


@hookimpl
def edgebuild_register_lowerings(register):
    """Core ML: a decomposition into MIL ops, imported when a node is lowered (coremltools is heavy)."""

    def lower_rms_norm(ctx, node):
        from edgebuild_example_ops.coreml import lower_rms_norm as lower

        return lower(ctx, node)

    register("coreml", OP_TYPE, lower_rms_norm, domain=DOMAIN)


@hookimpl
def edgebuild_register_passes(register):
    """The fusion that puts the op into models that write it out; off unless a recipe turns it on."""
    register("fuse_example_rms_norm", Lazy("edgebuild_example_ops.fusion:FuseRMSNorm").known(default=False))
