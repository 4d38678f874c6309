"""The core's own plugin: source resolvers and the ONNX frontend, registered like any other."""

from __future__ import annotations

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


# name -> (on by default, runs before constant folding); the passes themselves live in
# edgebuild.graph.fusion and edgebuild.graph.quantized, and load on first use (onnxscript's rewriter takes seconds
# to import, and planning a build reads only these facts)
PASSES = {
    "decompose_qoperator": (True, True),
    "decompose_dynamic_quant": (True, True),
    "dequantize_weights": (True, True),
    "unify_if_branches": (True, False),
    "fold_static_values": (True, False),
    "decompose_dynamic_quant_lstm": (True, False),
    "fuse_conv_bn": (True, False),
    "fuse_bias": (True, False),
    "fuse_activations": (True, False),
    "fuse_layer_norm": (True, False),
    "fuse_attention": (True, False),
    "fuse_rms_norm": (True, False),
    "fuse_rotary": (True, False),
    "fuse_grouped_query_attention": (True, False),
    "share_tied_embeddings": (True, True),
    "fuse_gated_mlp": (True, False),
    "saturate_discarded_int64": (True, False),
}


# the passes that live outside edgebuild.graph.fusion: name -> their module's ``graph_pass`` factory
PASS_FACTORIES = {
    "unify_if_branches": "edgebuild.graph.if_branches:graph_pass",
    "fold_static_values": "edgebuild.graph.static_values:graph_pass",
    "saturate_discarded_int64": "edgebuild.graph.int_ranges:graph_pass",
}


@hookimpl
def edgebuild_register_passes(register):
    for name, (default, before_folding) in PASSES.items():
        register(name, Lazy(PASS_FACTORIES.get(name, "edgebuild.graph.fusion:graph_pass"), name).known(
            name=name, default=default, before_folding=before_folding))
