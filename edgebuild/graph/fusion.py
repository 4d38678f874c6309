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

from edgebuild.graph.external_data import iter_graphs
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
from edgebuild.graph.fusion_rules._values import EDGEBUILD_DOMAIN
from edgebuild.graph.rule_matching import tried_at_their_first_op

MAX_ROUNDS = 8


@dataclass
class GraphPass:
    """A graph pass registered under ``name``; ``apply`` returns how many rewrites it made.

    ``min_opset`` is the ai.onnx opset the rewritten graph needs (e.g. 17 for
    LayerNormalization); the model's import is raised to it when the pass fires.
    ``before_folding`` passes run before constant folding, for patterns folding would erase.
    ``prepare`` normalises the graph first (e.g. constants to one side) to keep patterns few;
    ``commute`` asks onnxscript to also try every operand order of Add/Mul in the patterns.
    ``creates``: every (domain, op type) the rules' replacements may add to a graph; when given,
    each round tries only the rules that can match (see ``apply``).
    """

    name: str
    description: str
    rules: Callable[[], Sequence[pattern.RewriteRule]]
    default: bool = True
    min_opset: int | None = None
    before_folding: bool = False
    commute: bool = True
    prepare: Callable[[ir.Model], None] | None = None
    creates: frozenset[tuple[str, str]] | None = None

    def apply(self, model: ir.Model) -> int:
        if self.prepare is not None:
            self.prepare(model)
        rules = list(self.rules())
        tried: list[pattern.RewriteRule] = []
        rule_set = None
        total = 0
        for _ in range(MAX_ROUNDS):
            # A round in which no rule finds every op it names in the graph rewrites nothing, and
            # is skipped. With ``creates`` declared, a round tries only the rules whose ops are in
            # the graph or among those its rewrites may add (onnxscript tries every rule on every
            # node: most of a pass's time went to rules that could not match); the rules that
            # fire, and their order, are the same.
            present = op_identifiers(model)
            if not any(may_match(rule, present) for rule in rules):
                break
            reachable = present | self.creates if self.creates is not None else None
            applicable = rules if reachable is None else [rule for rule in rules if may_match(rule, reachable)]
            if applicable != tried:
                # Built per run and dropped after: onnxscript's matchers hold on to the last graph
                # they matched, and with it every weight of the model.
                rule_set, tried = pattern.RewriteRuleSet(applicable, commute=self.commute), applicable
            with tried_at_their_first_op(rule_set.rules):  # the commuted copies, as tried
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


def _domain(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


def op_identifiers(model: ir.Model) -> set[tuple[str, str]]:
    """(domain, op type) of every node: graph, subgraphs and model functions."""
    graphs = [*iter_graphs(model.graph), *model.functions.values()]
    return {(_domain(node.domain), node.op_type) for graph in graphs for node in graph}


def required_ops(rule: pattern.RewriteRule) -> set[tuple[str, str]] | None:
    """The (domain, op type) pairs every match of ``rule`` contains: the ops of its pattern's output
    nodes and of the nodes producing their inputs, transitively, not counting alternatives (an
    ``OrValue``'s branches) or ops given as patterns. None when the pattern cannot be read
    (an onnxscript whose rules are built differently): the rule is then always tried."""
    target = getattr(rule, "_target_pattern", None)
    outputs = getattr(target, "output_nodes", None)
    if outputs is None:
        return None
    required: set[tuple[str, str]] = set()
    seen: set[int] = set()
    stack = list(outputs)
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        identifier = _constant_op(node)
        if identifier is not None:
            required.add(identifier)
        for value in node.inputs:
            # only a node output's producer is certain to be matched; an OrValue has no producer
            producer = value.producer() if value is not None and type(value).__name__ == "NodeOutputPattern" else None
            if producer is not None:
                stack.append(producer)
    return required


def _constant_op(node) -> tuple[str, str] | None:
    """(domain, op type) of a node pattern naming both as constants (a commuted copy keeps them as
    string patterns only), else None."""
    if any(type(part).__name__ != "StringConstantPattern" for part in (node.domain, node.op)):
        return None
    return _domain(node.domain.value()), node.op.value()


def may_match(rule: pattern.RewriteRule, present: set[tuple[str, str]]) -> bool:
    required = required_ops(rule)
    return required is None or required <= present


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
            creates=frozenset({("", "Conv"), (EDGEBUILD_DOMAIN, "Linear")}),
        ),
        GraphPass(
            "fuse_activations",
            "ReLU6 -> Clip, HardSigmoid, HardSwish, x*sigmoid(x) -> edgebuild::Silu, "
            "erf/tanh GELU -> edgebuild::Gelu",
            activations.rules,
            min_opset=activations.MIN_OPSET,
            commute=False,  # the rules list their own operand orders
            prepare=activations.constants_to_the_right,
            creates=frozenset({("", "Clip"), ("", "HardSigmoid"), ("", "HardSwish"), (EDGEBUILD_DOMAIN, "Silu"),
                               (EDGEBUILD_DOMAIN, "Gelu")}),
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
