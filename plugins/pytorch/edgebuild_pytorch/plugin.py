"""Registers the PyTorch frontend with edgebuild, through the same hooks a third party uses.

Nothing here imports torch: the frontend is a ``Lazy`` stand-in until a build uses it.
"""

from __future__ import annotations

from edgebuild.plugin import Lazy, hookimpl

# What decides the imported model and judges it (the eager reference): torch.export and the module
# itself, a causal LM's transformers classes, the ONNX route's exporter (onnxscript) and IR, and
# coremltools' torch frontend on the Core ML route. Their versions join the import's and the
# validation's keys; known here so that planning a build imports none of them.
LIBRARIES = ("torch", "transformers", "onnxscript", "onnx-ir", "coremltools")


@hookimpl
def edgebuild_register_frontends(register):
    register("pytorch", Lazy("edgebuild_pytorch.frontend:PyTorchFrontend").known(libraries=LIBRARIES))


@hookimpl
def edgebuild_register_recipe_sections(register):
    from edgebuild_pytorch.options import PyTorchOptions

    register("pytorch:source.options", PyTorchOptions)
