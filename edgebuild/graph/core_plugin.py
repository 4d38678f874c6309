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
    from edgebuild.registry import Lazy

    register("onnx", Lazy("edgebuild.graph.frontend:OnnxFrontend"))


# name -> on by default; the passes themselves live in edgebuild.graph.fusion and load on
# first use (onnxscript's rewriter takes seconds to import, a no-op build has none to spare)
PASS_DEFAULTS = {
    "dequantize_weights": True,
    "fuse_conv_bn": True,
    "fuse_bias": True,
    "fuse_activations": True,
    "fuse_layer_norm": True,
    "fuse_attention": True,
}


class LazyPass:
    def __init__(self, name: str, default: bool):
        self.name, self.default = name, default

    def _real(self):
        from edgebuild.graph.fusion import PASSES

        return PASSES[self.name]

    def __getattr__(self, attr):
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(self._real(), attr)


@hookimpl
def edgebuild_register_passes(register):
    for name, default in PASS_DEFAULTS.items():
        register(name, LazyPass(name, default))
