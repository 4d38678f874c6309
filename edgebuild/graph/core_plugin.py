"""The core's own plugin: source resolvers and the ONNX frontend, registered like any other."""

from __future__ import annotations

import importlib

from edgebuild.hookspecs import hookimpl
from edgebuild.registration import Lazy


@hookimpl
def edgebuild_register_resolvers(register):
    from edgebuild.graph import resolvers

    register("file", resolvers.resolve_file)
    register("pypi", resolvers.resolve_pypi)
    register("https", resolvers.resolve_https)


@hookimpl
def edgebuild_register_frontends(register):
    from edgebuild.graph.source_files import external_data_files

    # known: every run asks (the resolve stage for the files, the import stage's key for the libraries),
    # without importing onnx_ir for it
    register("onnx", Lazy("edgebuild.graph.frontend:OnnxFrontend").known(source_files=external_data_files,
                                                                          libraries=()))


# name -> (the lowest optimize.level it runs at, runs before constant folding); the passes themselves
# live in edgebuild.graph.fusion and edgebuild.graph.quantized, and load on first use (onnxscript's
# rewriter takes seconds to import, and planning a build reads only these facts). O0: what the
# lowering needs (quantised forms decomposed, weights kept quantised, shapes a backend can take);
# O2: the fusions and the sharing of tied weights.
PASSES = {
    "decompose_qoperator": ("O0", True),
    "decompose_dynamic_quant": ("O0", True),
    "dequantize_weights": ("O0", True),
    "unify_if_branches": ("O0", False),
    "fold_static_values": ("O0", False),
    "decompose_dynamic_quant_lstm": ("O0", False),
    "fuse_conv_bn": ("O2", False),
    "fuse_bias": ("O2", False),
    "fuse_activations": ("O2", False),
    "fuse_layer_norm": ("O2", False),
    "fuse_attention": ("O2", False),
    "fuse_rms_norm": ("O2", False),
    "fuse_rotary": ("O2", False),
    "fuse_grouped_query_attention": ("O2", False),
    "share_tied_embeddings": ("O2", True),
    "fuse_gated_mlp": ("O2", False),
    "saturate_discarded_int64": ("O0", False),
}
DEFAULT_ON_UP_TO = ("O0", "O1", "O2")  # a pass of these levels is on in a recipe that names no level


# the passes that live outside edgebuild.graph.fusion: name -> their module's ``graph_pass`` factory
PASS_FACTORIES = {
    "unify_if_branches": "edgebuild.graph.if_branches:graph_pass",
    "fold_static_values": "edgebuild.graph.static_values:graph_pass",
    "saturate_discarded_int64": "edgebuild.graph.int_ranges:graph_pass",
}


def pass_at_level(factory: str, name: str, level: str):
    """The pass ``factory`` makes for ``name``, carrying the level this plugin's table gives it
    (the table, not each pass's module, says where a built-in pass belongs)."""
    module, _, attribute = factory.partition(":")
    graph_pass = getattr(importlib.import_module(module), attribute)(name)
    graph_pass.level = level
    return graph_pass


@hookimpl
def edgebuild_register_passes(register):
    for name, (level, before_folding) in PASSES.items():
        factory = PASS_FACTORIES.get(name, "edgebuild.graph.fusion:graph_pass")
        register(name, Lazy("edgebuild.graph.core_plugin:pass_at_level", factory, name, level).known(
            name=name, default=level in DEFAULT_ON_UP_TO, before_folding=before_folding, level=level))
