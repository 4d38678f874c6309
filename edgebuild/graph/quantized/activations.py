"""Weight-only mode: drop the fake quantisation of activations, keep the quantised weights.

A QDQ graph (from ``quantize_static``, or from the QOperator and dynamic decompositions) rounds
every activation to 8 bits and back: ``DequantizeLinear(QuantizeLinear(x))`` with calibrated
scales, or ``DequantizeLinear(DynamicQuantizeLinear(x))`` with scales computed at run time. With
the recipe's ``quantization: {activations: float}`` those pairs go, so activations stay float,
while every ``DequantizeLinear`` of a constant integer weight stays (the backend keeps it
compressed). A pair whose input is a constant is a weight quantised in the graph and stays too.
"""

from __future__ import annotations

import onnx_ir as ir

from edgebuild.graph.external_data import iter_graphs
from edgebuild.graph.quantized.qoperator import is_constant

# The integer types a weight is stored in; int32 DequantizeLinears are biases (folded to float).
WEIGHT_TYPES = {ir.DataType.INT4, ir.DataType.UINT4, ir.DataType.INT8, ir.DataType.UINT8, ir.DataType.INT16,
                ir.DataType.UINT16}


def _is_default_domain(node: ir.Node) -> bool:
    return node.domain in ("", "ai.onnx")


def activation_source(dequantize: ir.Node) -> ir.Value | None:
    """The float tensor a DequantizeLinear fake-quantises, or None if it dequantises something else."""
    if dequantize.op_type != "DequantizeLinear" or not _is_default_domain(dequantize):
        return None
    quantized = dequantize.inputs[0]
    producer = quantized.producer() if quantized is not None else None
    if producer is None or not _is_default_domain(producer):
        return None
    if producer.op_type == "QuantizeLinear":
        pass
    elif producer.op_type == "DynamicQuantizeLinear":
        # DequantizeLinear(y, y_scale, y_zero_point) of the same DynamicQuantizeLinear
        outputs = list(producer.outputs)
        if quantized is not outputs[0] or list(dequantize.inputs[1:3]) != outputs[1:3]:
            return None
    else:
        return None
    source = producer.inputs[0]
    if source is None or is_constant(source):
        return None  # a weight quantised in the graph, not an activation
    return source


def remove_activation_pairs(graph: ir.Graph) -> int:
    """Replace each activation fake-quant pair of ``graph`` by its float input; returns how many.

    The DequantizeLinear becomes an Identity of the input (keeping its output value, which may be a
    graph output); the optimiser removes the Identity and the quantiser left without users.
    """
    pairs = [(node, source) for node in graph if (source := activation_source(node)) is not None]
    for dequantize, source in pairs:
        identity = ir.node("Identity", [source], name=f"{dequantize.name or 'dequantize'}_float")
        ir.convenience.replace_nodes_and_values(graph, dequantize, [dequantize], [identity],
                                                [dequantize.outputs[0]], [identity.outputs[0]])
    return len(pairs)


def count_weight_dequantizers(model: ir.Model) -> int:
    """DequantizeLinear nodes of constant 4-, 8- or 16-bit integer data: the weights kept quantised."""
    count = 0
    for graph in iter_graphs(model.graph):
        for node in graph:
            if node.op_type == "DequantizeLinear" and _is_default_domain(node) and node.inputs[0] is not None:
                data = node.inputs[0]
                if data.dtype in WEIGHT_TYPES and is_constant(data):
                    count += 1
    return count


class FloatActivations:
    """The pass the optimise stage runs for ``quantization: {activations: float}``."""

    name = "float_activations"
    description = "DequantizeLinear(QuantizeLinear(x)) / DequantizeLinear(DynamicQuantizeLinear(x)) -> x " \
                  "for runtime tensors x; weight DequantizeLinears stay"
    default = False
    before_folding = True

    def apply(self, model: ir.Model) -> int:
        return sum(remove_activation_pairs(graph) for graph in list(iter_graphs(model.graph)))
