"""The core's own plugin: source resolvers and the ONNX frontend, registered like any other."""

from __future__ import annotations

from edgebuild.hookspecs import hookimpl
from edgebuild.plugin import Lazy


@hookimpl
def edgebuild_register_resolvers(register):
    from edgebuild.graph import resolvers

    register("file", resolvers.resolve_file)
    register("pypi", resolvers.resolve_pypi)
    register("https", resolvers.resolve_https)


@hookimpl
def edgebuild_register_frontends(register):
    register("onnx", Lazy("edgebuild.graph.frontend:OnnxFrontend"))


# name -> on by default; the passes themselves live in edgebuild.graph.fusion and load on
# first use (onnxscript's rewriter takes seconds to import, a no-op build has none to spare):
# planning a build reads each pass's ``default`` (and name) from the stand-in alone.
PASS_DEFAULTS = {
    "dequantize_weights": True,
    "fuse_conv_bn": True,
    "fuse_bias": True,
    "fuse_activations": True,
    "fuse_layer_norm": True,
    "fuse_attention": True,
}


@hookimpl
def edgebuild_register_passes(register):
    for name, default in PASS_DEFAULTS.items():
        register(name, Lazy("edgebuild.graph.fusion:graph_pass", name).known(name=name, default=default))
