"""Registers the Core ML backend with edgebuild, through the same hooks a third party uses."""

from __future__ import annotations

import importlib
import pkgutil

from edgebuild.plugin import hookimpl


def _import_all(package: str) -> None:
    module = importlib.import_module(package)
    for info in pkgutil.iter_modules(module.__path__):
        importlib.import_module(f"{package}.{info.name}")


@hookimpl
def edgebuild_register_lowerings(register):
    from edgebuild_coreml.lowering.registry import LOWERINGS

    _import_all("edgebuild_coreml.lowering.ops")
    LOWERINGS.register_all(register)


@hookimpl
def edgebuild_register_backends(register):
    from edgebuild.plugin import Lazy

    register("coreml", Lazy("edgebuild_coreml.backend:CoreMLBackend").known(default=True))


@hookimpl
def edgebuild_register_recipe_sections(register):
    from edgebuild_coreml.compress.config import CompressionSection

    register("coreml:compression", CompressionSection)


@hookimpl
def edgebuild_register_runtimes(register):
    from edgebuild.plugin import Lazy

    register("mil-interpreter", Lazy("edgebuild_coreml.runtime:InterpreterRuntime").known(native=False))
    register("coreml", Lazy("edgebuild_coreml.coreml_runtime:CoreMLRuntime").known(native=True))
