"""ConvTranspose whose batch is known only at run time (a detector's roi count; lowering/ops/conv.py).

The spatial dims and the kernel are static, so pads and output_padding are placed at build time;
the batch stays symbolic. Each case runs in the MIL interpreter against onnxruntime at several
batches, over strides, pads, output_padding, dilations, groups and every auto_pad, with the batch
both a symbolic input dim and a count computed in the graph (rows kept by a mask, as after NMS).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest
from onnx_cases import IR_VERSION, assert_matches, lower, lower_and_run, rand, run_onnxruntime

RTOL, ATOL = 1e-4, 1e-5
BATCHES = (1, 3, 0)

# (attrs, input [C, spatial...] without the batch, weight shape [C_in, C_out / group, kernel...])
CASES = {
    "plain": ({}, (4, 5, 6), (4, 3, 3, 3)),
    "stride2": ({"strides": [2, 2]}, (4, 5, 6), (4, 3, 2, 2)),  # Mask R-CNN's mask head
    "pads": ({"strides": [2, 1], "pads": [1, 0, 2, 1]}, (4, 5, 6), (4, 3, 3, 3)),
    "output_padding": ({"strides": [3, 2], "output_padding": [2, 1]}, (4, 5, 6), (4, 3, 3, 3)),
    "output_padding_pads": ({"strides": [2, 2], "pads": [1, 1, 0, 0], "output_padding": [1, 1]}, (4, 5, 6),
                            (4, 2, 3, 3)),
    "dilations": ({"dilations": [2, 3], "pads": [1, 2, 1, 0]}, (4, 5, 6), (4, 3, 3, 2)),
    "groups": ({"group": 2, "strides": [2, 2], "pads": [1, 1, 1, 1]}, (4, 5, 6), (4, 3, 3, 3)),
    "depthwise": ({"group": 4, "strides": [2, 1]}, (4, 5, 6), (4, 1, 3, 3)),
    "same_upper": ({"auto_pad": "SAME_UPPER", "strides": [2, 3]}, (4, 5, 6), (4, 3, 3, 4)),
    "same_lower": ({"auto_pad": "SAME_LOWER", "strides": [2, 2]}, (4, 5, 6), (4, 3, 3, 2)),
    "valid": ({"auto_pad": "VALID", "strides": [2, 2]}, (4, 5, 6), (4, 3, 3, 3)),
    "output_shape": ({"strides": [2, 2], "output_shape": [11, 13]}, (4, 5, 6), (4, 3, 3, 3)),
    "conv1d": ({"strides": [2], "pads": [1, 2], "output_padding": [1]}, (4, 7), (4, 3, 3)),
    "conv3d": ({"strides": [2, 1, 2], "pads": [1, 0, 0, 0, 1, 1]}, (2, 3, 4, 5), (2, 3, 2, 2, 3)),
}


def _weights(w_shape, attrs):
    out_channels = w_shape[1] * attrs.get("group", 1)
    return [onh.from_array(rand(*w_shape, seed=1), "w"), onh.from_array(rand(out_channels, seed=2), "b")]


def _model(nodes, inputs, initializers) -> onnx.ModelProto:
    graph = oh.make_graph(nodes, "case", inputs, [onnx.ValueInfoProto(name="y")], initializers)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=IR_VERSION)
    return onnx.shape_inference.infer_shapes(model)


def symbolic_batch(attrs, x_shape, w_shape) -> onnx.ModelProto:
    """x: [n, C, spatial...] with n a symbolic input dim."""
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", *x_shape])
    node = oh.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    return _model([node], [x], _weights(w_shape, attrs))


def counted_batch(attrs, x_shape, w_shape, rows: int) -> onnx.ModelProto:
    """x: [rows, C, spatial...] static; the rows kept by ``keep`` (a run-time count) are transposed."""
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [rows, *x_shape])
    keep = oh.make_tensor_value_info("keep", onnx.TensorProto.BOOL, [rows])
    axis = onh.from_array(np.array([0], dtype=np.int64), "axis")
    nodes = [oh.make_node("NonZero", ["keep"], ["where"]),  # [1, K], as torchvision's boolean indexing
             oh.make_node("Squeeze", ["where", "axis"], ["rows"]),
             oh.make_node("Gather", ["x", "rows"], ["kept"], axis=0),
             oh.make_node("ConvTranspose", ["kept", "w", "b"], ["y"], **attrs)]
    return _model(nodes, [x, keep], [*_weights(w_shape, attrs), axis])


def _compare(model, feeds):
    expected = run_onnxruntime(model, feeds)["y"]
    actual = lower_and_run(model, feeds)["y"]
    assert actual.shape == expected.shape
    assert_matches(actual, expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", sorted(CASES))
def test_symbolic_batch(case):
    attrs, x_shape, w_shape = CASES[case]
    model = symbolic_batch(attrs, x_shape, w_shape)
    for batch in BATCHES:
        _compare(model, {"x": rand(batch, *x_shape, seed=batch)})


@pytest.mark.parametrize("case", sorted(CASES))
def test_batch_counted_in_the_graph(case):
    attrs, x_shape, w_shape = CASES[case]
    rows = 5
    model = counted_batch(attrs, x_shape, w_shape, rows)
    for kept in ([True, False, True, True, False], [False] * rows, [True] * rows):
        _compare(model, {"x": rand(rows, *x_shape, seed=3), "keep": np.array(kept)})


def test_the_program_keeps_the_batch_symbolic():
    attrs, x_shape, w_shape = CASES["output_padding_pads"]
    result = lower(symbolic_batch(attrs, x_shape, w_shape))
    [output] = result.program.functions["main"].outputs
    assert not isinstance(output.shape[0], (int, np.integer)) and list(output.shape[1:]) == [2, 11, 13]  # 2 (5 - 1) + 3 + 1 - 1, 2 (6 - 1) + 3 + 1 - 1


def test_symbolic_spatial_dims_are_still_declined():
    from edgebuild.errors import BuildError

    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, "h", 6])
    node = oh.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2])
    model = _model([node], [x], _weights((4, 3, 3, 3), {}))
    with pytest.raises(BuildError, match="static spatial input dims"):
        lower(model)
