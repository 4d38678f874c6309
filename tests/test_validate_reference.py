"""Which onnxruntime session is the reference: a graph that quantises activations runs unoptimised.

onnxruntime's extended optimisations fuse Q/DQ pairs and integer ops into kernels that
requantise differently from the graph as written; weight-only dequantisation is plain float
arithmetic and keeps the optimised session.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgebuild.verify.reference import quantises_activations


def _save(tmp_path, nodes, initializers, name="m.onnx"):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], initializers)
    path = tmp_path / name
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def _weight():
    return [numpy_helper.from_array(np.ones((4, 4), np.int8), "w"), numpy_helper.from_array(np.float32(0.1), "s")]


def test_a_weight_only_graph_keeps_the_optimised_session(tmp_path):
    nodes = [helper.make_node("DequantizeLinear", ["w", "s"], ["wf"]), helper.make_node("MatMul", ["x", "wf"], ["y"])]
    assert not quantises_activations(_save(tmp_path, nodes, _weight()))


def test_a_graph_that_quantises_an_activation_runs_op_by_op(tmp_path):
    nodes = [helper.make_node("DequantizeLinear", ["w", "s"], ["wf"]),
             helper.make_node("QuantizeLinear", ["x", "s"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s"], ["xd"]),
             helper.make_node("MatMul", ["xd", "wf"], ["y"])]
    assert quantises_activations(_save(tmp_path, nodes, _weight()))


def test_dynamic_quantisation_counts_too(tmp_path):
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["y"])]
    assert quantises_activations(_save(tmp_path, nodes, []))
