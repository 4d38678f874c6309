"""A fusion pass: ``Mul(x, Sigmoid(x))`` becomes ``mydomain::Swish2(x, beta=1)``."""

from __future__ import annotations

import onnx_ir as ir

from edgebuild.plugin import GraphPass

from edgebuild_swish import DOMAIN, OP_TYPE


class FuseSwish2(GraphPass):
    description = "Mul(x, Sigmoid(x)) -> mydomain::Swish2 (beta 1)"

    def apply(self, model: ir.Model) -> int:
        graph, rewrites = model.graph, 0
        for mul in list(graph):
            if mul.op_type != "Mul" or mul.domain not in ("", "ai.onnx") or len(mul.inputs) != 2:
                continue
            x = _gated_input(*mul.inputs)
            if x is None:
                continue
            swish = ir.node(OP_TYPE, [x], attributes={"beta": 1.0}, domain=DOMAIN)
            ir.convenience.replace_nodes_and_values(graph, mul, [mul], [swish], mul.outputs, swish.outputs)
            rewrites += 1
        if rewrites:
            model.opset_imports.setdefault(DOMAIN, 1)
            for node in list(graph):  # the Sigmoids nothing reads any more
                if node.op_type == "Sigmoid" and not any(output.uses() or output.is_graph_output()
                                                         for output in node.outputs):
                    graph.remove(node, safe=True)
        return rewrites


def _gated_input(a: ir.Value | None, b: ir.Value | None) -> ir.Value | None:
    """``x`` when one of ``a``, ``b`` is ``Sigmoid(x)`` of the other."""
    for gate, x in ((a, b), (b, a)):
        producer = gate.producer() if gate is not None else None
        if producer is not None and producer.op_type == "Sigmoid" and producer.inputs[0] is x:
            return x
    return None
