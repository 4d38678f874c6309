"""Weight-only mode: drop the fake quantisation of activations, keep the quantised weights.

A QDQ graph (from ``quantize_static``, or from the QOperator and dynamic decompositions) rounds
every activation to 8 bits and back: ``DequantizeLinear(QuantizeLinear(x))`` with calibrated
scales, or ``DequantizeLinear(DynamicQuantizeLinear(x))`` with scales computed at run time. With
the recipe's ``quantization: {activations: float}`` those pairs go, so activations stay float,
while every ``DequantizeLinear`` of a constant integer weight stays (the backend keeps it
compressed). A pair whose input is a constant is a weight quantised in the graph and stays too.

Only the rounding goes, not the range: onnxruntime's quantiser drops a Relu or Clip whose bounds
the following QuantizeLinear's saturation already enforces, so a calibrated pair becomes
``Clip(x, (q_min - zero_point) * scale, (q_max - zero_point) * scale)``. A dynamic pair's range
always spans its input, so it becomes the input itself.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from edgebuild.graph.external_data import iter_graphs
from edgebuild.graph.quantized._emit import const_array, is_constant

# The integer types a weight is stored in; int32 DequantizeLinears are biases (folded to float).
WEIGHT_TYPES = {ir.DataType.INT4, ir.DataType.UINT4, ir.DataType.INT8, ir.DataType.UINT8, ir.DataType.INT16,
                ir.DataType.UINT16}


def _is_default_domain(node: ir.Node) -> bool:
    return node.domain in ("", "ai.onnx")


_RANGES = {ir.DataType.INT4: (-8, 7), ir.DataType.UINT4: (0, 15), ir.DataType.INT8: (-128, 127),
           ir.DataType.UINT8: (0, 255), ir.DataType.INT16: (-32768, 32767), ir.DataType.UINT16: (0, 65535)}


def _saturation_bounds(quantize: ir.Node) -> tuple[float, float] | None:
    """The float range a per-tensor QuantizeLinear with constant parameters saturates to, or None."""
    scale = const_array(quantize.inputs[1])
    zero_value = quantize.inputs[2] if len(quantize.inputs) > 2 else None
    zero = const_array(zero_value) if zero_value is not None else np.zeros((), np.uint8)
    out_type = quantize.outputs[0].dtype or (zero_value.dtype if zero_value is not None else ir.DataType.UINT8)
    if scale is None or zero is None or scale.size != 1 or zero.size != 1 or out_type not in _RANGES:
        return None
    low, high = _RANGES[out_type]
    s, z = float(scale.reshape(())), float(np.asarray(zero, np.float64).reshape(()))
    return (low - z) * s, (high - z) * s


def activation_source(dequantize: ir.Node) -> ir.Value | None:
    """The float tensor a DequantizeLinear fake-quantises, or None if it dequantises something else."""
    if dequantize.op_type != "DequantizeLinear" or not _is_default_domain(dequantize):
        return None
    quantized = dequantize.inputs[0]
    producer = quantized.producer() if quantized is not None else None
    if producer is None or not _is_default_domain(producer):
        return None
    if producer.op_type == "QuantizeLinear":
        if _saturation_bounds(producer) is None:
            return None  # per-axis or computed parameters: not a calibrated activation pair
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


def _float_replacement(dequantize: ir.Node, source: ir.Value, opset: int) -> tuple[list[ir.Node], ir.Value]:
    """What stands for the pair: Clip to the quantiser's range, or Identity for a dynamic pair."""
    base = dequantize.name or "dequantize"
    quantize = dequantize.inputs[0].producer()
    if quantize.op_type == "DynamicQuantizeLinear":
        node = ir.node("Identity", [source], name=f"{base}_float")
        return [node], node.outputs[0]
    low, high = _saturation_bounds(quantize)
    if opset < 11:  # Clip takes its bounds as attributes before opset 11
        node = ir.node("Clip", [source], attributes={"min": low, "max": high}, name=f"{base}_range")
        return [node], node.outputs[0]
    float_type = (source.dtype or ir.DataType.FLOAT).numpy()
    bounds = [ir.node("Constant", [], attributes={"value": ir.tensor(np.array(v, float_type))},
                      name=f"{base}_range_{side}") for side, v in (("low", low), ("high", high))]
    node = ir.node("Clip", [source, bounds[0].outputs[0], bounds[1].outputs[0]], name=f"{base}_range")
    return [*bounds, node], node.outputs[0]


def remove_activation_pairs(graph: ir.Graph, opset: int = 13) -> int:
    """Replace each activation fake-quant pair of ``graph`` by its float input, clipped to the
    quantiser's range; returns how many. ``opset`` is the model's ai.onnx opset (Clip's form).

    The DequantizeLinear's output value is kept (it may be a graph output); the optimiser removes
    the quantiser left without users.
    """
    removed = 0
    for dequantize in list(graph):
        # Found as the walk reaches each node: a pair may quantise what an earlier pair's removal
        # rewired (x -> Q -> DQ -> Q -> DQ), and must read the rewired input.
        source = activation_source(dequantize)
        if source is None:
            continue
        nodes, output = _float_replacement(dequantize, source, opset)
        ir.convenience.replace_nodes_and_values(graph, dequantize, [dequantize], nodes,
                                                [dequantize.outputs[0]], [output])
        removed += 1
    return removed


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
    description = "DequantizeLinear(QuantizeLinear(x)) -> Clip(x) to the quantiser's range, " \
                  "DequantizeLinear(DynamicQuantizeLinear(x)) -> x, for runtime tensors x; weights stay quantised"
    default = False
    before_folding = True

    def apply(self, model: ir.Model) -> int:
        opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 13))
        return sum(remove_activation_pairs(graph, opset) for graph in list(iter_graphs(model.graph)))
