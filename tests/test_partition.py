"""The partitioner: custom-op kernels get their own segment, hand-offs are right, tiny
segments merge into a neighbour that can run them, a fully supported model stays whole."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from edgebuild.errors import BuildError
from edgebuild.graph.partition import handoffs, partition, segment_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recipes" / "models"))
import make_example_ops_model as example  # noqa: E402

KERNELS = {(example.DOMAIN, example.OP_TYPE): object()}


def standard_only(node: ir.Node) -> bool:
    return node.domain in ("", "ai.onnx")


def supports_all_but(*op_types):
    return lambda node: standard_only(node) and node.op_type not in op_types


def chain(op_types: list[str]) -> ir.Model:
    """x -> op_types[0] -> op_types[1] -> ... -> y, all unary on [2, 8]."""
    names = ["x"] + [f"v{i}" for i in range(len(op_types) - 1)] + ["y"]
    nodes = [helper.make_node(op, [a], [b], name=f"n{i}_{op}") for i, (op, a, b) in enumerate(zip(op_types, names, names[1:]))]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])])
    return ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def test_custom_op_in_the_middle_gives_three_segments_with_hand_offs():
    model = ir.serde.deserialize_model(example.build())
    segments = partition(model, [("coreml", standard_only)], KERNELS, kernel_backend="msl", min_segment_ops=4)
    assert [s.backend for s in segments] == ["coreml", "msl", "coreml"]
    assert [[n.name for n in s.nodes] for s in segments] == [
        ["fc1", "fc1_bias", "relu", "gain"], ["rms_norm"], ["fc2", "fc2_bias", "sigmoid", "gain2"]]
    assert [(s.inputs, s.outputs) for s in segments] == [(["x"], ["h4"]), (["h4"], ["normed"]), (["normed"], ["y"])]
    edges = [(h.tensor, h.producer, h.consumer) for h in handoffs(segments, ["x"], ["y"])]
    assert edges == [("x", None, 0), ("h4", 0, 1), ("normed", 1, 2), ("y", 2, None)]


def test_segment_models_compose_to_the_whole():
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.op_run import OpRun

    class RMSNorm(OpRun):
        op_domain = example.DOMAIN

        def _run(self, x, scale, epsilon=1e-6):
            return ((x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + epsilon) * scale).astype(x.dtype),)

    proto = example.build()
    model = ir.serde.deserialize_model(proto)
    segments = partition(model, [("coreml", standard_only)], KERNELS, kernel_backend="msl")
    x = np.random.default_rng(0).standard_normal(example.SHAPE).astype(np.float32)
    values = {"x": x}
    for segment in segments:
        piece = ir.to_proto(segment_model(model, segment))
        outputs = ReferenceEvaluator(piece, new_ops=[RMSNorm]).run(None, {n: values[n] for n in segment.inputs})
        values.update(zip(segment.outputs, outputs))
    whole = ReferenceEvaluator(proto, new_ops=[RMSNorm]).run(None, {"x": x})[0]
    np.testing.assert_allclose(values["y"], whole, rtol=1e-6)


def test_fully_supported_model_stays_one_segment():
    model = chain(["Relu", "Sigmoid", "Tanh"])
    segments = partition(model, [("coreml", standard_only), ("mpsgraph", standard_only)])
    assert len(segments) == 1 and segments[0].backend == "coreml" and segments[0].outputs == ["y"]


def test_tiny_segment_between_two_of_one_backend_is_merged():
    # gpu is preferred but cannot run Sin; the lone Relu between Sin runs is not worth a hand-off
    model = chain(["Sin"] * 4 + ["Relu"] + ["Sin"] * 4)
    backends = [("gpu", supports_all_but("Sin")), ("cpu", standard_only)]
    assert [s.backend for s in partition(model, backends, min_segment_ops=1)] == ["cpu", "gpu", "cpu"]
    merged = partition(model, backends, min_segment_ops=4)
    assert [(s.backend, s.op_count) for s in merged] == [("cpu", 9)]


def test_tiny_segment_the_neighbour_cannot_run_stays():
    model = chain(["Relu"] * 4 + ["Sin"] + ["Relu"] * 4)
    backends = [("gpu", supports_all_but("Sin")), ("cpu", standard_only)]
    assert [s.backend for s in partition(model, backends, min_segment_ops=4)] == ["gpu", "cpu", "gpu"]


def test_schedule_keeps_independent_branches_of_one_backend_together():
    # two branches from x: Sin (cpu) and Relu (gpu), interleaved in graph order
    nodes = [helper.make_node("Sin", ["x"], ["a0"]), helper.make_node("Relu", ["x"], ["b0"]),
             helper.make_node("Sin", ["a0"], ["a1"]), helper.make_node("Relu", ["b0"], ["b1"]),
             helper.make_node("Add", ["a1", "b1"], ["y"])]
    graph = helper.make_graph(nodes, "branches", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    segments = partition(model, [("gpu", supports_all_but("Sin")), ("cpu", standard_only)], min_segment_ops=1)
    assert [(s.backend, s.op_count) for s in segments] == [("cpu", 2), ("gpu", 3)]
    assert segments[1].inputs == ["x", "a1"]


def test_unsupported_node_is_named():
    model = chain(["Relu", "Sin"])
    with pytest.raises(BuildError, match="Sin 'n1_Sin'"):
        partition(model, [("gpu", supports_all_but("Sin"))])
