"""Registers the PyTorch frontend with edgebuild, through the same hooks a third party uses.

Nothing here imports torch: the frontend is a ``Lazy`` stand-in until a build uses it.
"""

from __future__ import annotations

from edgebuild.plugin import Lazy, hookimpl


@hookimpl
def edgebuild_register_frontends(register):
    register("pytorch", Lazy("edgebuild_pytorch.frontend:PyTorchFrontend"))


@hookimpl
def edgebuild_register_recipe_sections(register):
    from edgebuild_pytorch.options import PyTorchOptions

    register("pytorch:source.options", PyTorchOptions)
