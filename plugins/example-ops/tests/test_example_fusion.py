"""The fusion pass: RMS normalisation written out in ONNX ops becomes one com.example::RMSNorm,
and the fused model computes what the written-out one does."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest

from edgebuild.plugin.testing import random_inputs, reference_outputs

from edgebuild_example_ops import DOMAIN, OP_TYPE
from edgebuild_example_ops.fusion import FuseRMSNorm

D = 16


def _written_out(*, square: str = "Pow", axis: int = -1, extra_reader: bool = False) -> onnx.ModelProto:
    """``x / sqrt(mean(x**2, axis) + eps) * scale`` in ONNX ops (opset 18: ReduceMean's axes an input)."""
    f = onnx.TensorProto.FLOAT
    constants = [onnx.numpy_helper.from_array(np.array([axis], np.int64), "axes"),
                 onnx.numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
                 onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two"),
                 onnx.numpy_helper.from_array(np.linspace(0.5, 1.5, D, dtype=np.float32), "scale")]
    nodes = [oh.make_node("Pow", ["X", "two"], ["sq"]) if square == "Pow" else oh.make_node("Mul", ["X", "X"], ["sq"]),
             oh.make_node("ReduceMean", ["sq", "axes"], ["mean"], keepdims=1),
             oh.make_node("Add", ["mean", "eps"], ["var"]),
             oh.make_node("Sqrt", ["var"], ["rms"]),
             oh.make_node("Div", ["X", "rms"], ["normalised"]),
             oh.make_node("Mul", ["normalised", "scale"], ["Y"])]
    outputs = [oh.make_tensor_value_info("Y", f, [2, 3, D])]
    if extra_reader:  # the statistics are an output too: fusing would drop them
        outputs.append(oh.make_tensor_value_info("rms", f, None))
    graph = oh.make_graph(nodes, "rms", [oh.make_tensor_value_info("X", f, [2, 3, D])], outputs, constants)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)


def _fused(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    graph = ir.serde.deserialize_model(model)
    rewrites = FuseRMSNorm().apply(graph)
    return ir.serde.serialize_model(graph), rewrites


@pytest.mark.parametrize("square", ["Pow", "Mul"])
def test_the_pattern_becomes_one_node_that_computes_the_same(square):
    model = _written_out(square=square)
    fused, rewrites = _fused(model)
    assert rewrites == 1
    assert [(n.domain, n.op_type) for n in fused.graph.node] == [(DOMAIN, OP_TYPE)]
    assert fused.graph.node[0].attribute[0].f == pytest.approx(1e-5)
    inputs = random_inputs(model, seed=5)
    want, _ = reference_outputs(model, inputs)  # onnxruntime on the ops as written
    got, reference = reference_outputs(fused, inputs)  # the op's registered reference
    assert OP_TYPE in reference
    np.testing.assert_allclose(got["Y"], want["Y"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("near_miss", [{"axis": 0}, {"extra_reader": True}])
def test_a_near_miss_is_left_alone(near_miss):
    fused, rewrites = _fused(_written_out(**near_miss))
    assert rewrites == 0 and OP_TYPE not in {n.op_type for n in fused.graph.node}
