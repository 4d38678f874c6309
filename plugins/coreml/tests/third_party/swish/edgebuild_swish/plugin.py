"""The hooks edgebuild calls; the entry point ``swish`` names this module."""

from __future__ import annotations

from edgebuild.plugin import Lazy, OpReference, hookimpl

from edgebuild_swish import DOMAIN, OP_TYPE


@hookimpl
def edgebuild_register_lowerings(register):
    from edgebuild_swish.coreml import LOWERINGS  # imports coremltools: only when something lowers

    LOWERINGS.register_all(register)


@hookimpl
def edgebuild_register_custom_ops(register):
    from edgebuild_swish.reference import swish2

    register(DOMAIN, OP_TYPE, OpReference(DOMAIN, OP_TYPE, reference=swish2, inputs=("X",), outputs=("Y",),
                                          attributes={"beta": 1.0}))


@hookimpl
def edgebuild_register_passes(register):
    register("fuse_swish2", Lazy("edgebuild_swish.fusion:FuseSwish2").known(default=True, before_folding=False))
