"""The core's own plugin: source resolvers and the ONNX frontend, registered like any other."""

from __future__ import annotations

from edgebuild.hookspecs import hookimpl
from edgebuild.protocols import GraphPass


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


# name -> (on by default, runs before constant folding); the passes themselves live in
# edgebuild.graph.fusion and load on first use (onnxscript's rewriter takes seconds to import, and
# planning a build reads only these two facts)
PASSES = {
    "dequantize_weights": (True, True),
    "fuse_conv_bn": (True, False),
    "fuse_bias": (True, False),
    "fuse_activations": (True, False),
    "fuse_layer_norm": (True, False),
    "fuse_attention": (True, False),
}


class FusionPass(GraphPass):
    """One of :mod:`edgebuild.graph.fusion`'s passes, imported when it first applies."""

    def __init__(self, name: str, default: bool, before_folding: bool):
        self.name, self.default, self.before_folding = name, default, before_folding

    @property
    def description(self) -> str:
        return self._real().description

    def apply(self, model) -> int:
        return self._real().apply(model)

    def _real(self):
        from edgebuild.graph.fusion import PASSES as FUSION_PASSES

        return FUSION_PASSES[self.name]


@hookimpl
def edgebuild_register_passes(register):
    for name, (default, before_folding) in PASSES.items():
        register(name, FusionPass(name, default, before_folding))
