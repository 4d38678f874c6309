"""Tensors with no elements, where ONNX allows them: empty slices, Expand and Tile to a 0 dim,
Concat with an empty operand, a scatter of no updates. Each graph turns its empty values into a
result that has elements (Core ML has no zero-size outputs), lowered and run against onnxruntime.

The shifted-window attention mask of torchvision's Swin3D (exported by TorchScript) is the
form: a window slice that is empty when the shift is 0, expanded, stacked into indices, scattered.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest
from onnx_cases import IR_VERSION, check, rand

F32, I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64


def _model(nodes, inputs, output_shape, initializers=()):
    graph = oh.make_graph(
        nodes, "empty",
        [oh.make_tensor_value_info(name, F32, array.shape) for name, array in inputs.items()],
        [oh.make_tensor_value_info("y", F32, output_shape)],
        [onh.from_array(np.asarray(array), name) for name, array in initializers],
    )
    return onnx.shape_inference.infer_shapes(
        oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=IR_VERSION))


def _ints(*values):
    return np.array(values, np.int64)


def _empty_then_joined(make_empty, initializers=()):
    """``x`` [2, 3, 4] joined on its last axis with the [2, 3, 0] value ``make_empty`` builds."""
    nodes = [*make_empty, oh.make_node("Concat", ["x", "empty"], ["y"], axis=-1)]
    return _model(nodes, {"x": rand(2, 3, 4)}, [2, 3, 4], initializers)


CASES = {
    "slice_past_the_end": ([oh.make_node("Slice", ["x", "four", "four", "last"], ["empty"])],
                           [("four", _ints(4)), ("last", _ints(2))]),
    "slice_backwards_with_a_positive_step": ([oh.make_node("Slice", ["x", "three", "one", "last"], ["empty"])],
                                             [("three", _ints(3)), ("one", _ints(1)), ("last", _ints(2))]),
    "expand_to_a_zero_dim": ([oh.make_node("Slice", ["x", "zero", "one", "last"], ["column"]),
                              oh.make_node("Expand", ["column", "to"], ["empty"])],
                             [("zero", _ints(0)), ("one", _ints(1)), ("last", _ints(2)), ("to", _ints(2, 3, 0))]),
    "tile_by_zero": ([oh.make_node("Tile", ["x", "reps"], ["empty"])], [("reps", _ints(1, 1, 0))]),
    "split_with_a_part_of_zero": ([oh.make_node("Split", ["x", "sizes"], ["whole", "empty"], axis=2)],
                                  [("sizes", _ints(4, 0))]),
    "elementwise_of_empty": ([oh.make_node("Slice", ["x", "four", "four", "last"], ["sliced"]),
                              oh.make_node("Mul", ["sliced", "sliced"], ["empty"])],
                             [("four", _ints(4)), ("last", _ints(2))]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_empty_value_joined_matches_onnxruntime(case):
    nodes, initializers = CASES[case]
    inputs = {"x": rand(2, 3, 4)}
    check(_empty_then_joined(nodes, initializers), inputs)


@pytest.mark.parametrize("op, indices", [("ScatterND", np.zeros((0, 1), np.int64)),
                                         ("ScatterElements", np.zeros((0, 5), np.int64))])
def test_scatter_of_no_updates_returns_the_data(op, indices):
    """A scatter whose indices address nothing ([0, 1] tuples, [0, 5] elements): the data comes back."""
    nodes = [
        oh.make_node("Slice", ["x", "zero", "zero", "first"], ["updates"]),  # [0, 5]
        oh.make_node(op, ["x", "indices", "updates"], ["y"]),
    ]
    initializers = [("zero", _ints(0)), ("first", _ints(0)), ("indices", indices)]
    check(_model(nodes, {"x": rand(4, 5)}, [4, 5], initializers), {"x": rand(4, 5)})


def test_shifted_window_mask_with_an_empty_window():
    """Swin3D's mask: ``mask[d, h, w] = count`` for window slices, one of them empty (a shift of 0).

    The indices of the empty slice come from Expand to a 0 dim and Concat; the scatter writes
    nothing; the mask is then added to the input."""
    mask = np.zeros((2, 3, 4), np.float32)
    nodes = [
        oh.make_node("Range", ["start", "limit", "step"], ["rows"]),  # [0, 1]
        oh.make_node("Reshape", ["rows", "column_shape"], ["rows_column"]),  # [2, 1, 1]
        oh.make_node("Expand", ["rows_column", "window"], ["d"]),  # [2, 3, 0]: the empty window
        oh.make_node("Unsqueeze", ["d", "last"], ["d_index"]),
        oh.make_node("Concat", ["d_index", "d_index", "d_index"], ["indices"], axis=-1),  # [2, 3, 0, 3]
        oh.make_node("ConstantOfShape", ["update_shape"], ["updates"],
                     value=onh.from_array(np.array([7.0], np.float32))),  # [2, 3, 0]
        oh.make_node("ScatterND", ["mask", "indices", "updates"], ["filled"]),
        oh.make_node("Add", ["x", "filled"], ["y"]),
    ]
    initializers = [("start", np.array(0, np.int64)), ("limit", np.array(2, np.int64)), ("step", np.array(1, np.int64)),
                    ("column_shape", _ints(2, 1, 1)), ("window", _ints(2, 3, 0)), ("last", _ints(-1)),
                    ("update_shape", _ints(2, 3, 0)), ("mask", mask)]
    check(_model(nodes, {"x": rand(2, 3, 4)}, [2, 3, 4], initializers), {"x": rand(2, 3, 4)})
