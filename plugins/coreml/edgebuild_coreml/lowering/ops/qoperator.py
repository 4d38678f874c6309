"""QOperator ops (QLinearConv, QLinearMatMul, com.microsoft QGemm and QLinear*) lowered through
the core's QDQ decomposition.

A build never sees these nodes: the optimise stage's ``decompose_qoperator`` pass rewrites them
into ``DequantizeLinear -> float op -> QuantizeLinear``. These lowerings cover what reaches the
converter without that stage (single-node conformance cases, a recipe that turns the pass off):
the node is decomposed by the very same code, in a graph of its own, and the pieces are lowered
by their usual lowerings. Constant operands stay constants, so a weight still becomes a
constexpr op.
"""

from __future__ import annotations

import onnx_ir as ir

from edgebuild.plugin.graph import MS_DOMAIN, REWRITES, rewrite_graph
from edgebuild_coreml.lowering.registry import lowers


def _single_node_graph(ctx, node: ir.Node) -> tuple[ir.Graph, list]:
    """A graph holding a copy of ``node``: constant operands as initializers, the others as inputs
    (returned with the MIL values to bind them to)."""
    inputs, bound, initializers = [], [], []
    copied_inputs: list[ir.Value | None] = []
    for index, value in enumerate(node.inputs):
        if value is None or value.name == "":
            copied_inputs.append(None)
            continue
        local = ir.Value(name=f"in{index}", shape=value.shape, type=value.type)
        constant = ctx.const_value(value)
        if constant is not None:
            local.const_value = ir.tensor(constant, name=local.name)
            initializers.append(local)
        else:
            inputs.append(local)
            bound.append(ctx.input(node, index))
        copied_inputs.append(local)
    copy = ir.Node(node.domain, node.op_type, copied_inputs, attributes=list(node.attributes.values()),
                   num_outputs=1, name=node.name or "qoperator")
    copy.outputs[0].name = "out"
    copy.outputs[0].type = node.outputs[0].type
    graph = ir.Graph(inputs, copy.outputs, nodes=[copy], initializers=initializers, name="qoperator")
    return graph, bound


def lower_qoperator(ctx, node):
    graph, bound = _single_node_graph(ctx, node)
    rewrite_graph(graph, ctx.opset)
    return ctx.lower_subgraph(graph, bound)[0]


for _domain, _op in REWRITES:
    lowers(_op, domain=_domain, since=1 if _domain == MS_DOMAIN else 10)(lower_qoperator)
