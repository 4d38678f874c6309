"""Shape op lowerings against onnxruntime: shapes, reshapes, concat/split/expand/tile, ranges and
slicing (lowering/ops/shape.py, combine.py, slice.py). One-node models, lowered and run in
edgebuild's MIL interpreter."""

from __future__ import annotations

import numpy as np
import onnx.numpy_helper as onh
import pytest
from onnx_cases import I64, X, check, check_op, feeds_of, lower, lower_and_run, op_table_test, rand, single_node_model

from edgebuild_coreml.lowering.errors import LoweringError

# (op, inputs, attrs, initializer names, opset, outputs)
CASES = {
    # shapes
    "shape": ("Shape", {"x": X}, {}, (), 18, 1),
    "shape_start_end": ("Shape", {"x": X}, {"start": -2, "end": 10}, (), 18, 1),
    "size": ("Size", {"x": X}, {}, (), 18, 1),
    "reshape_zero_minus_one": ("Reshape", {"x": X, "s": I64(0, -1)}, {}, ("s",), 18, 1),
    "reshape_runtime_shape": ("Reshape", {"x": X, "s": I64(4, 6)}, {}, (), 18, 1),
    "flatten": ("Flatten", {"x": X}, {"axis": 2}, (), 18, 1),
    "flatten_axis0": ("Flatten", {"x": X}, {"axis": 0}, (), 18, 1),
    "flatten_neg": ("Flatten", {"x": X}, {"axis": -1}, (), 18, 1),
    "squeeze_input": ("Squeeze", {"x": X[:1], "a": I64(0)}, {}, ("a",), 18, 1),
    "squeeze_opset11_attr": ("Squeeze", {"x": X[:1, :, :1]}, {"axes": [0, -1]}, (), 11, 1),
    "squeeze_all": ("Squeeze", {"x": X[:1, :, :1]}, {}, (), 18, 1),
    "unsqueeze": ("Unsqueeze", {"x": X, "a": I64(-1, 0)}, {}, ("a",), 18, 1),
    "unsqueeze_opset11": ("Unsqueeze", {"x": X}, {"axes": [1]}, (), 11, 1),
    "transpose": ("Transpose", {"x": X}, {"perm": [2, 0, 1]}, (), 18, 1),
    "transpose_default": ("Transpose", {"x": X}, {}, (), 18, 1),
    "concat": ("Concat", {"a": X, "b": X[:, :1]}, {"axis": 1}, (), 18, 1),
    "concat_neg_axis": ("Concat", {"a": X, "b": X}, {"axis": -1}, (), 18, 1),
    "split_sizes": ("Split", {"x": X, "s": I64(1, 3)}, {"axis": 2}, ("s",), 18, 2),
    "split_equal": ("Split", {"x": X}, {"axis": 2}, (), 13, 2),
    "split_opset11_attr": ("Split", {"x": X}, {"axis": 1, "split": [2, 1]}, (), 11, 2),
    "split_num_outputs_uneven": ("Split", {"x": X}, {"axis": 1, "num_outputs": 2}, (), 18, 2),
    "expand": ("Expand", {"x": X[:, :1], "s": I64(2, 1, 3, 1)}, {}, ("s",), 18, 1),
    "expand_runtime_shape": ("Expand", {"x": X[:, :1], "s": I64(2, 3, 4)}, {}, (), 18, 1),
    "tile": ("Tile", {"x": X, "r": I64(1, 2, 3)}, {}, ("r",), 18, 1),
    "constant_of_shape": ("ConstantOfShape", {"s": I64(2, 3)}, {}, ("s",), 18, 1),
    "constant_of_shape_runtime_int": ("ConstantOfShape", {"s": I64(2, 3)}, {"value": onh.from_array(np.array([7], np.int64))}, (), 18, 1),
    "range_int": ("Range", {"a": np.array(1, np.int64), "b": np.array(10, np.int64), "c": np.array(3, np.int64)}, {}, ("a", "b", "c"), 18, 1),
    "range_float_runtime": ("Range", {"a": np.array(1, np.float32), "b": np.array(2, np.float32), "c": np.array(0.3, np.float32)}, {}, (), 18, 1),
    # slicing
    "slice_basic": ("Slice", {"x": X, "s": I64(1), "e": I64(3), "a": I64(1)}, {}, ("s", "e", "a"), 18, 1),
    "slice_clamped": ("Slice", {"x": X, "s": I64(-100, 1), "e": I64(100, 1000), "a": I64(0, 2)}, {}, ("s", "e", "a"), 18, 1),
    "slice_negative_step": ("Slice", {"x": X, "s": I64(-1), "e": I64(-100), "a": I64(2), "st": I64(-2)}, {}, ("s", "e", "a", "st"), 18, 1),
    "slice_negative_step_int64_min": ("Slice", {"x": X, "s": I64(2), "e": I64(np.iinfo(np.int64).min), "a": I64(1), "st": I64(-1)}, {}, ("s", "e", "a", "st"), 18, 1),
    "slice_end_int64_max": ("Slice", {"x": X, "s": I64(1), "e": I64(np.iinfo(np.int64).max)}, {}, ("s", "e"), 18, 1),
    "slice_opset9_attrs": ("Slice", {"x": X}, {"starts": [0, 1], "ends": [1, -1], "axes": [0, 2]}, (), 9, 1),
}


test_matches_onnxruntime = op_table_test(CASES)


def test_slice_takes_runtime_starts():
    """Runtime starts/ends go to slice_by_index as tensors, clamped the ONNX way."""
    model = single_node_model("Slice", {"x": X, "s": I64(0), "e": I64(1)})
    check(model, {"x": X, "s": I64(0), "e": I64(1)})


def test_slice_runtime_starts_need_constant_steps():
    inputs = {"x": X, "s": I64(0), "e": I64(1), "a": I64(1), "st": I64(1)}
    model = single_node_model("Slice", inputs, initializers=("a",))
    with pytest.raises(LoweringError, match=r"'node' \(Slice\).*steps must be a constant"):
        check(model, inputs, initializers=("a",))


@pytest.mark.parametrize("starts,ends", [([1, -3], [3, 100]), ([-100, 0], [-1, 2]), ([4, 1], [2, 4])])
def test_slice_runtime_starts_and_ends(starts, ends):
    inputs = {"x": rand(4, 5, seed=30), "starts": np.array(starts, np.int64), "ends": np.array(ends, np.int64),
              "axes": np.array([0, 1], np.int64)}
    check_op("Slice", inputs, opset=13, initializers=("axes",))


def test_slice_runtime_starts_refuse_negative_steps():
    inputs = {"x": rand(4, 5, seed=31), "starts": np.array([3], np.int64), "ends": np.array([0], np.int64),
              "axes": np.array([1], np.int64), "steps": np.array([-1], np.int64)}
    model = single_node_model("Slice", inputs, opset=13, initializers=("axes", "steps"))
    with pytest.raises(LoweringError, match="positive steps"):
        lower_and_run(model, feeds_of(inputs, ("axes", "steps")))


def test_shape_folds_to_a_constant():
    """A static Shape becomes a constant, so shape arithmetic leaves no ops behind."""
    result = lower(single_node_model("Shape", {"x": X}))
    assert result.op_counts == {"const": 1} or set(result.op_counts) <= {"const", "identity"}


@pytest.mark.parametrize("initializers", [("a", "b", "c"), ("a", "c")], ids=["constant", "runtime_limit"])
def test_range_reads_single_element_vectors_as_scalars(initializers):
    """ONNX's own function bodies (AffineGrid's) feed Range the [1]-shaped pieces of a split shape;
    onnxruntime's shape inference refuses such a model, so the reference evaluator checks it."""
    from onnx_cases import check_reference

    inputs = {"a": I64(0), "b": I64(5), "c": I64(2)}
    model = single_node_model("Range", inputs, opset=18, initializers=initializers)
    check_reference(model, inputs, initializers=initializers)
