"""The built-in fusion passes, each a named set of onnxscript rewrite rules.

A pass rewrites until nothing more matches, because the rules compose: SiLU first becomes
``edgebuild::Silu``, a MatMul becomes ``edgebuild::Linear`` and a following Add then
folds into its bias. Ops with their own ``edgebuild`` domain are defined, with numpy
references, in :mod:`edgebuild.graph.fused_reference`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnxscript.rewriter import pattern

from edgebuild.graph.fusion_rules import (
    activations,
    attention,
    bias,
    conv_bn,
    dequant,
    gated_mlp,
    grouped_query,
    layer_norm,
    rms_norm,
    rotary,
    tied_embeddings,
)

MAX_ROUNDS = 8


@dataclass
class GraphPass:
    """A graph pass registered under ``name``; ``apply`` returns how many rewrites it made.

    ``min_opset`` is the ai.onnx opset the rewritten graph needs (e.g. 17 for
    LayerNormalization); the model's import is raised to it when the pass fires.
    ``before_folding`` passes run before constant folding, for patterns folding would erase.
    ``prepare`` normalises the graph first (e.g. constants to one side) to keep patterns few;
    ``commute`` asks onnxscript to also try every operand order of Add/Mul in the patterns.
    """

    name: str
    description: str
    rules: Callable[[], Sequence[pattern.RewriteRule]]
    default: bool = True
    min_opset: int | None = None
    before_folding: bool = False
    commute: bool = True
    prepare: Callable[[ir.Model], None] | None = None

    def apply(self, model: ir.Model) -> int:
        if self.prepare is not None:
            self.prepare(model)
        # Built per run and dropped after: onnxscript's matchers hold on to the last graph they
        # matched, and with it every weight of the model.
        rule_set = pattern.RewriteRuleSet(list(self.rules()), commute=self.commute)
        total = 0
        for _ in range(MAX_ROUNDS):
            fired = rule_set.apply_to_model(model)
            total += fired
            if not fired:
                break
        if total:
            # Rules may leave producers they looked through (e.g. a Transpose) without users.
            common_passes.RemoveUnusedNodesPass()(model)
            if self.min_opset is not None:
                raise_onnx_opset(model, self.min_opset)
        return total


def raise_onnx_opset(model: ir.Model, version: int) -> None:
    """Make the model import ai.onnx at ``version`` or newer."""
    key = "ai.onnx" if "ai.onnx" in model.opset_imports and "" not in model.opset_imports else ""
    if model.opset_imports.get(key, 0) < version:
        model.opset_imports[key] = version


PASSES: dict[str, GraphPass] = {
    p.name: p
    for p in (
        GraphPass(
            "dequantize_weights",
            "INT8/UINT8 weight -> Cast -> [Sub zero point] -> Mul scale becomes DequantizeLinear, "
            "so backends keep the weights compressed",
            dequant.rules,
            before_folding=True,
        ),
        GraphPass(
            "fuse_conv_bn",
            "fold BatchNormalization into the preceding Conv's constant weights and bias",
            conv_bn.rules,
            commute=False,
        ),
        GraphPass(
            "fuse_bias",
            "Conv + Add -> Conv with bias; Gemm / MatMul [+ Add] -> edgebuild::Linear",
            bias.rules,
        ),
        GraphPass(
            "fuse_activations",
            "ReLU6 -> Clip, HardSigmoid, HardSwish, x*sigmoid(x) -> edgebuild::Silu, "
            "erf/tanh GELU -> edgebuild::Gelu",
            activations.rules,
            min_opset=activations.MIN_OPSET,
            commute=False,  # the rules list their own operand orders
            prepare=activations.constants_to_the_right,
        ),
        GraphPass(
            "fuse_layer_norm",
            "mean/variance/normalise/scale/shift chains -> LayerNormalization (opset 17)",
            layer_norm.rules,
            min_opset=17,
        ),
        GraphPass(
            "fuse_attention",
            "softmax(Q @ K^T * scale + mask) @ V -> edgebuild::ScaledDotProductAttention",
            attention.rules,
        ),
        GraphPass(
            "fuse_rms_norm",
            "x * 1/sqrt(mean(x^2) + eps) * w (casts included) -> SimplifiedLayerNormalization",
            rms_norm.rules,
            commute=False,  # onnxscript's rules list their operand orders themselves
        ),
        GraphPass(
            "fuse_rotary",
            "x * cos + rotate_half(x) * sin (half-split or interleaved pairs) -> RotaryEmbedding (opset 23)",
            rotary.rules,
            min_opset=rotary.MIN_OPSET,
        ),
        GraphPass(
            "fuse_grouped_query_attention",
            "attention over K/V repeated to the query head count (repeat_kv) -> "
            "edgebuild::ScaledDotProductAttention on the shared K/V heads",
            grouped_query.rules,
        ),
        GraphPass(
            "share_tied_embeddings",
            "LM head MatMul(h, Transpose(E)) of the embedding table E -> edgebuild::Linear whose "
            "[out, in] layout is E itself, so the artifact stores the table once",
            tied_embeddings.rules,
            before_folding=True,  # folding would turn the Transpose into a second copy first
            commute=False,
        ),
        GraphPass(
            "fuse_gated_mlp",
            "silu(x @ W_gate) * (x @ W_up) -> edgebuild::SwiGLU(gate, up)",
            gated_mlp.rules,
        ),
    )
}


# The quantised-graph passes rewrite nodes directly rather than through rewrite rules
# (edgebuild.graph.quantized): name -> "module:attribute" of the pass object, imported only when asked for.
QUANTIZED_PASSES = {
    "decompose_qoperator": "edgebuild.graph.quantized.qoperator:PASS",
    "decompose_dynamic_quant": "edgebuild.graph.quantized.dynamic:PASS",
    "decompose_dynamic_quant_lstm": "edgebuild.graph.quantized.dynamic_lstm:PASS",
}


def graph_pass(name: str):
    """The built-in pass ``name``: what the core plugin's lazy stand-in resolves to."""
    if name in QUANTIZED_PASSES:
        import importlib

        module, attribute = QUANTIZED_PASSES[name].split(":")
        return getattr(importlib.import_module(module), attribute)
    return PASSES[name]
