"""Scan (lowering/ops/scan.py) against onnxruntime: states and scan outputs, scan axes and
directions on both sides, several scan inputs, no state at all, and opset 8's batch axis."""

from __future__ import annotations

import onnx
import onnx.helper as oh
import pytest
from onnx_cases import IR_VERSION, check, rand

F = onnx.TensorProto.FLOAT


def _body(state_shapes, row_shapes, nodes, outputs):
    inputs = [oh.make_tensor_value_info(f"s{k}", F, s) for k, s in enumerate(state_shapes)]
    inputs += [oh.make_tensor_value_info(f"r{k}", F, s) for k, s in enumerate(row_shapes)]
    return oh.make_graph(nodes, "body", inputs, [oh.make_tensor_value_info(name, F, None) for name in outputs])


def _model(body, inputs, outputs, opset=11, **attrs):
    node = oh.make_node("Scan", [name for name, _ in inputs], outputs, body=body, **attrs)
    graph = oh.make_graph([node], "g", [oh.make_tensor_value_info(name, F, shape) if name else None
                                        for name, shape in inputs if name],
                          [oh.make_tensor_value_info(name, F, None) for name in outputs])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], ir_version=IR_VERSION)


# a running sum (state) and, per row, the sum times the row (scan output)
_SUM_BODY = _body([[4]], [[4]], [oh.make_node("Add", ["s0", "r0"], ["n0"]), oh.make_node("Mul", ["n0", "r0"], ["o0"])],
                  ["n0", "o0"])


@pytest.mark.parametrize("attrs, x_shape", [
    ({}, [5, 4]),
    ({"scan_input_directions": [1]}, [5, 4]),
    ({"scan_input_axes": [1]}, [4, 5]),
    ({"scan_output_directions": [1]}, [5, 4]),
    ({"scan_output_axes": [1]}, [5, 4]),
    ({"scan_input_axes": [-1], "scan_input_directions": [1], "scan_output_axes": [-1]}, [4, 5]),
])
def test_running_sum(attrs, x_shape):
    model = _model(_SUM_BODY, [("init", [4]), ("x", x_shape)], ["total", "rows"], num_scan_inputs=1, **attrs)
    check(model, {"init": rand(4, seed=1), "x": rand(*x_shape, seed=2)})


def test_two_scan_inputs_and_two_states():
    body = _body([[3], [3]], [[3], [2, 3]], [
        oh.make_node("Add", ["s0", "r0"], ["n0"]),
        oh.make_node("ReduceMax", ["r1"], ["m"], axes=[0], keepdims=0),
        oh.make_node("Mul", ["s1", "m"], ["n1"]),
        oh.make_node("Sub", ["n0", "n1"], ["o0"]),
    ], ["n0", "n1", "o0", "m"])
    model = _model(body, [("a", [3]), ("b", [3]), ("x", [6, 3]), ("y", [6, 2, 3])], ["fa", "fb", "d", "maxes"],
                   num_scan_inputs=2)
    check(model, {"a": rand(3, seed=1), "b": rand(3, seed=2), "x": rand(6, 3, seed=3), "y": rand(6, 2, 3, seed=4)})


def test_no_state_maps_rows():
    body = _body([], [[2, 3]], [oh.make_node("Transpose", ["r0"], ["t"], perm=[1, 0])], ["t"])
    model = _model(body, [("x", [4, 2, 3])], ["y"], num_scan_inputs=1)
    check(model, {"x": rand(4, 2, 3)})


def test_opset8_batch_axis():
    model = _model(_SUM_BODY, [("", None), ("init", [2, 4]), ("x", [2, 5, 4])], ["total", "rows"], opset=8,
                   num_scan_inputs=1, directions=[1])
    check(model, {"init": rand(2, 4, seed=1), "x": rand(2, 5, 4, seed=2)})
