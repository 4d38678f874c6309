"""A fusion pass: RMS normalisation written out in ONNX ops becomes one ``com.example::RMSNorm``.

The pattern, as a plain export writes ``x / sqrt(mean(x**2, -1) + eps) * scale``::

    Pow(X, 2) | Mul(X, X) -> ReduceMean(axes=[-1], keepdims=1) -> Add(eps) -> Sqrt -> Div(X, .) -> Mul(., scale)

with ``eps`` and ``scale`` constants. Every intermediate value must have no other reader, so the
rewrite never removes something the rest of the graph uses.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from edgebuild.plugin import GraphPass

from edgebuild_example_ops import DOMAIN, OP_TYPE


class FuseRMSNorm(GraphPass):
    description = "x / sqrt(mean(x^2, -1) + eps) * scale -> com.example::RMSNorm"
    default = False  # on when the recipe's optimize.passes names it (edgebuild's own fuse_rms_norm comes first)

    def apply(self, model: ir.Model) -> int:
        graph, rewrites = model.graph, 0
        for mul in list(graph):
            match = _match(mul)
            if match is None:
                continue
            x, scale, epsilon, nodes = match
            fused = ir.node(OP_TYPE, [x, scale], attributes={"epsilon": epsilon}, domain=DOMAIN,
                            name=mul.name or None)
            ir.convenience.replace_nodes_and_values(graph, mul, nodes, [fused], mul.outputs, fused.outputs)
            rewrites += 1
        if rewrites:
            model.opset_imports.setdefault(DOMAIN, 1)
        return rewrites


def _match(mul: ir.Node):
    """``(x, scale, epsilon, the nodes replaced)`` when ``mul`` ends the pattern, else None."""
    if not _is(mul, "Mul"):
        return None
    for normalised, scale in ((mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])):
        div = _only_reader_producer(normalised, "Div")
        if div is None or _constant(scale) is None or _constant(scale).ndim != 1:
            continue
        x, root = div.inputs
        sqrt = _only_reader_producer(root, "Sqrt")
        add = _only_reader_producer(sqrt.inputs[0], "Add") if sqrt else None
        if add is None:
            continue
        for mean_value, eps_value in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
            mean = _only_reader_producer(mean_value, "ReduceMean")
            epsilon = _constant(eps_value)
            if mean is None or epsilon is None or epsilon.size != 1 or not _over_last_axis(mean, x):
                continue
            square = _only_reader_producer(mean.inputs[0], "Pow", "Mul")
            if square is not None and _squares(square, x):
                return x, scale, float(epsilon.reshape(())), [mul, div, sqrt, add, mean, square]
    return None


def _is(node: ir.Node | None, *op_types: str) -> bool:
    return node is not None and node.op_type in op_types and node.domain in ("", "ai.onnx")


def _only_reader_producer(value: ir.Value | None, *op_types: str) -> ir.Node | None:
    """The producer of ``value`` when it is one of ``op_types`` and ``value`` is read once, inside the pattern."""
    producer = value.producer() if value is not None else None
    if not _is(producer, *op_types) or len(value.uses()) != 1 or value.is_graph_output():
        return None
    return producer


def _constant(value: ir.Value | None) -> np.ndarray | None:
    if value is None:
        return None
    if value.const_value is not None:
        return value.const_value.numpy()
    producer = value.producer()
    if _is(producer, "Constant") and "value" in producer.attributes:
        return producer.attributes["value"].value.numpy()
    return None


def _over_last_axis(mean: ir.Node, x: ir.Value) -> bool:
    """ReduceMean over the last axis, keeping it (axes an input from opset 18, an attribute before)."""
    keepdims = mean.attributes["keepdims"].value if "keepdims" in mean.attributes else 1
    if len(mean.inputs) > 1:
        axes = _constant(mean.inputs[1])
    else:
        axes = np.asarray(mean.attributes["axes"].value) if "axes" in mean.attributes else None
    if keepdims != 1 or axes is None or axes.size != 1:
        return False
    axis = int(axes.reshape(()))
    return axis == -1 or (x.shape is not None and axis == len(x.shape) - 1)


def _squares(node: ir.Node, x: ir.Value) -> bool:
    """``node`` is ``x * x`` or ``x ** 2``."""
    if node.op_type == "Mul":
        return node.inputs[0] is x and node.inputs[1] is x
    exponent = _constant(node.inputs[1])
    return node.inputs[0] is x and exponent is not None and exponent.size == 1 and float(exponent.reshape(())) == 2.0
