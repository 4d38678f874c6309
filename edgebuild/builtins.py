"""The core's own plugin: source resolvers and the ONNX frontend, registered like any other."""

from __future__ import annotations

from edgebuild.hookspecs import hookimpl


@hookimpl
def edgebuild_register_resolvers(register):
    from edgebuild.graph import resolvers

    register("file", resolvers.resolve_file)
    register("pypi", resolvers.resolve_pypi)
    register("https", resolvers.resolve_https)


@hookimpl
def edgebuild_register_frontends(register):
    from edgebuild.graph.frontend import OnnxFrontend

    register("onnx", OnnxFrontend())


@hookimpl
def edgebuild_register_passes(register):
    from edgebuild.graph import fusion

    for name, graph_pass in fusion.PASSES.items():
        register(name, graph_pass)
