"""Op lowerings (math, logic, casts, reductions, shapes, indexing) against onnxruntime.

Each case is a one-node ONNX model; the lowered MIL program runs in edgebuild's MIL
interpreter and must match onnxruntime's output.
"""

from __future__ import annotations

import numpy as np
import onnx.numpy_helper as onh
import pytest
from onnx_cases import check, check_op, lower, single_node_model

from edgebuild_coreml.lowering.errors import LoweringError

rng = np.random.default_rng(7)
X = rng.standard_normal((2, 3, 4)).astype(np.float32)
POS = (np.abs(X) + 0.1).astype(np.float32)
UNIT = np.clip(X / 3, -0.95, 0.95).astype(np.float32)
I64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731

# (op, inputs, attrs, initializer names, opset, outputs)
CASES = {
    # binary / variadic math
    "add_broadcast": ("Add", {"a": X, "b": X[0, 0]}, {}, (), 18, 1),
    "sub": ("Sub", {"a": X, "b": X[::-1]}, {}, (), 18, 1),
    "mul_int": ("Mul", {"a": I64(3, -4, 5), "b": I64(2, 2, -2)}, {}, (), 18, 1),
    "div_float": ("Div", {"a": X, "b": POS}, {}, (), 18, 1),
    "div_int_truncates": ("Div", {"a": I64(7, -7, 7, -7, 0, 6), "b": I64(2, 2, -2, -2, 3, -3)}, {}, (), 18, 1),
    "pow": ("Pow", {"a": POS, "b": X}, {}, (), 18, 1),
    "pow_int_exponent": ("Pow", {"a": X, "b": I64(2)}, {}, ("b",), 18, 1),
    "mod_int": ("Mod", {"a": I64(7, -7, 7, -7, 4), "b": I64(3, 3, -3, -3, 2)}, {}, (), 18, 1),
    "mod_fmod_int": ("Mod", {"a": I64(7, -7, 7, -7), "b": I64(3, 3, -3, -3)}, {"fmod": 1}, (), 18, 1),
    "mod_fmod_float": ("Mod", {"a": X * 5, "b": POS + 1}, {"fmod": 1}, (), 18, 1),
    "max3": ("Max", {"a": X, "b": X[0], "c": -X}, {}, (), 18, 1),
    "min1": ("Min", {"a": X}, {}, (), 18, 1),
    "sum": ("Sum", {"a": X, "b": X}, {}, (), 18, 1),
    "mean": ("Mean", {"a": X, "b": X[0], "c": X[0, 0]}, {}, (), 18, 1),
    # unary math
    **{
        f"unary_{op.lower()}": (op, {"x": data}, {}, (), 18, 1)
        for op, data in [
            ("Abs", X), ("Neg", X), ("Reciprocal", POS), ("Sqrt", POS), ("Exp", X), ("Log", POS),
            ("Ceil", X), ("Floor", X), ("Sign", X), ("Sin", X), ("Cos", X), ("Tan", UNIT),
            ("Asin", UNIT), ("Acos", UNIT), ("Atan", X), ("Sinh", X), ("Cosh", X), ("Asinh", X),
            ("Acosh", POS + 1), ("Atanh", UNIT), ("Erf", X),
        ]
    },
    "round_half_even": ("Round", {"x": np.array([0.5, 1.5, 2.5, -0.5, -1.5, 0.4], np.float32)}, {}, (), 18, 1),
    "abs_int": ("Abs", {"x": I64(-3, 0, 4)}, {}, (), 18, 1),
    "neg_int": ("Neg", {"x": I64(-3, 0, 4)}, {}, (), 18, 1),
    "isnan": ("IsNaN", {"x": np.array([np.nan, 1, np.inf], np.float32)}, {}, (), 18, 1),
    "isinf": ("IsInf", {"x": np.array([np.nan, 1, np.inf, -np.inf], np.float32)}, {}, (), 18, 1),
    "isinf_neg_only": ("IsInf", {"x": np.array([1, np.inf, -np.inf], np.float32)}, {"detect_positive": 0}, (), 18, 1),
    "not": ("Not", {"x": X > 0}, {}, (), 18, 1),
    # comparison / logic
    **{
        f"compare_{op.lower()}": (op, {"a": X, "b": np.round(X)}, {}, (), 18, 1)
        for op in ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual")
    },
    "equal_int": ("Equal", {"a": I64(1, 2, 3), "b": I64(1, 0, 3)}, {}, (), 18, 1),
    "equal_bool": ("Equal", {"a": X > 0, "b": X > 0.5}, {}, (), 18, 1),
    **{f"logic_{op.lower()}": (op, {"a": X > 0, "b": X > 0.5}, {}, (), 18, 1) for op in ("And", "Or", "Xor")},
    "where": ("Where", {"c": X > 0, "a": X, "b": X[0, 0]}, {}, (), 18, 1),
    # casts
    "cast_float_to_int": ("Cast", {"x": X * 3}, {"to": 7}, (), 18, 1),
    "cast_int_to_float": ("Cast", {"x": I64(1, -2, 3)}, {"to": 1}, (), 18, 1),
    "cast_to_bool": ("Cast", {"x": np.round(X)}, {"to": 9}, (), 18, 1),
    "cast_const": ("Cast", {"x": I64(1, 2, 3)}, {"to": 1}, ("x",), 18, 1),
    "castlike": ("CastLike", {"x": X * 3, "like": I64(0)}, {}, (), 18, 1),
    "identity": ("Identity", {"x": X}, {}, (), 18, 1),
    "dropout": ("Dropout", {"x": X}, {}, (), 18, 1),
    "dropout_mask": ("Dropout", {"x": X}, {}, (), 18, 2),
    # reductions
    "reducesum_axes_input": ("ReduceSum", {"x": X, "axes": I64(1, -1)}, {}, ("axes",), 18, 1),
    "reducesum_opset11_attr": ("ReduceSum", {"x": X}, {"axes": [0], "keepdims": 0}, (), 11, 1),
    "reducesum_all": ("ReduceSum", {"x": X}, {"keepdims": 0}, (), 18, 1),
    "reducesum_noop": ("ReduceSum", {"x": X}, {"noop_with_empty_axes": 1}, (), 18, 1),
    "reducemean_attr_13": ("ReduceMean", {"x": X}, {"axes": [2]}, (), 13, 1),
    "reducemax_input": ("ReduceMax", {"x": X, "axes": I64(0)}, {}, ("axes",), 18, 1),
    "reducemin": ("ReduceMin", {"x": X, "axes": I64(-1)}, {"keepdims": 0}, ("axes",), 18, 1),
    "reduceprod": ("ReduceProd", {"x": X, "axes": I64(1)}, {}, ("axes",), 18, 1),
    "reducel1": ("ReduceL1", {"x": X, "axes": I64(1)}, {}, ("axes",), 18, 1),
    "reducel2": ("ReduceL2", {"x": X, "axes": I64(1)}, {}, ("axes",), 18, 1),
    "reducelogsum": ("ReduceLogSum", {"x": POS, "axes": I64(1)}, {}, ("axes",), 18, 1),
    "reducelogsumexp": ("ReduceLogSumExp", {"x": X, "axes": I64(2)}, {}, ("axes",), 18, 1),
    "reducesumsquare": ("ReduceSumSquare", {"x": X, "axes": I64(0, 2)}, {}, ("axes",), 18, 1),
    "argmax": ("ArgMax", {"x": X}, {"axis": 1}, (), 18, 1),
    "argmin_flat": ("ArgMin", {"x": X}, {"axis": -1, "keepdims": 0}, (), 18, 1),
    "argmax_last_index": ("ArgMax", {"x": np.array([[1, 3, 3], [2, 2, 1]], np.float32)}, {"axis": 1, "select_last_index": 1}, (), 18, 1),
    "argmin_first_index": ("ArgMin", {"x": np.array([[1, 0, 0], [2, 2, 3]], np.float32)}, {"axis": 1}, (), 18, 1),
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
    # indexing
    "gather": ("Gather", {"x": X, "i": I64(0, -1, 1)}, {"axis": 1}, (), 18, 1),
    "gather_scalar_index": ("Gather", {"x": X, "i": I64(2)}, {"axis": 2}, ("i",), 18, 1),
    "gather_const_data": ("Gather", {"x": I64(5, 6, 7), "i": I64(-1, 0)}, {}, ("x",), 18, 1),
    "gather_elements": ("GatherElements", {"x": X, "i": rng.integers(-3, 3, (2, 3, 4))}, {"axis": 1}, (), 18, 1),
    "gather_elements_smaller": ("GatherElements", {"x": X, "i": np.array([[[0, -1, 1, 0]]], np.int64)}, {"axis": 1}, (), 18, 1),
    "gather_nd": ("GatherND", {"x": X, "i": np.array([[0, -1], [1, 2]], np.int64)}, {}, (), 18, 1),
    "gather_nd_batch": ("GatherND", {"x": X, "i": np.array([[1], [2]], np.int64)}, {"batch_dims": 1}, (), 18, 1),
    "scatter_nd": ("ScatterND", {"x": X, "i": np.array([[0, 1], [1, 2]], np.int64), "u": np.ones((2, 4), np.float32)}, {}, (), 18, 1),
    "scatter_nd_add": ("ScatterND", {"x": X, "i": np.array([[0, 1], [0, 1]], np.int64), "u": np.ones((2, 4), np.float32)}, {"reduction": "add"}, (), 18, 1),
    "scatter_nd_max": ("ScatterND", {"x": X, "i": np.array([[1], [0]], np.int64), "u": np.zeros((2, 3, 4), np.float32)}, {"reduction": "max"}, (), 18, 1),
    "scatter_elements": ("ScatterElements", {"x": X, "i": np.tile(np.array([[[2], [0], [1]]], np.int64), (2, 1, 4)), "u": -X}, {"axis": 1}, (), 18, 1),
    "scatter_elements_smaller": ("ScatterElements", {"x": X, "i": np.array([[[0, -1, 1, 0]]], np.int64), "u": np.ones((1, 1, 4), np.float32)}, {"axis": 1}, (), 18, 1),
    "scatter_elements_mul": ("ScatterElements", {"x": X, "i": np.array([[[0, 0, 1, 2]]], np.int64), "u": np.full((1, 1, 4), 2, np.float32)}, {"axis": 1, "reduction": "mul"}, (), 18, 1),
    "onehot": ("OneHot", {"i": I64(0, -1, 2), "d": I64(4), "v": np.array([0, 5], np.float32)}, {}, ("d", "v"), 18, 1),
    "onehot_axis0_float_indices": ("OneHot", {"i": np.array([1.0, 3.0], np.float32), "d": I64(4), "v": I64(-1, 1)}, {"axis": 0}, ("d", "v"), 18, 1),
    "nonzero": ("NonZero", {"x": np.array([[1, 0], [0, 3]], np.float32)}, {}, (), 18, 1),
    # ordering and running ops
    "trilu_upper": ("Trilu", {"x": X}, {}, (), 18, 1),
    "trilu_lower_k": ("Trilu", {"x": X, "k": I64(1)}, {"upper": 0}, (), 18, 1),
    "trilu_upper_negative_k": ("Trilu", {"x": X, "k": I64(-1)}, {}, ("k",), 18, 1),
    "cumsum": ("CumSum", {"x": X, "a": I64(1)}, {}, ("a",), 18, 1),
    "cumsum_exclusive_reverse": ("CumSum", {"x": X, "a": I64(-1)}, {"exclusive": 1, "reverse": 1}, ("a",), 18, 1),
    "topk_largest": ("TopK", {"x": X, "k": I64(2)}, {}, ("k",), 18, 2),
    "topk_smallest_axis": ("TopK", {"x": X, "k": I64(1)}, {"largest": 0, "axis": 1}, ("k",), 18, 2),
    # einsum
    "einsum_matmul": ("Einsum", {"a": X, "b": rng.standard_normal((2, 4, 5)).astype(np.float32)}, {"equation": "bij,bjk->bik"}, (), 18, 1),
    "einsum_outer_transposed": ("Einsum", {"a": X[0, 0], "b": X[1, 1]}, {"equation": "i,j->ji"}, (), 18, 1),
    "einsum_sum_out_and_contract": ("Einsum", {"a": X, "b": X}, {"equation": "bij,cij->bc"}, (), 18, 1),
    "einsum_single_transpose_sum": ("Einsum", {"a": X}, {"equation": "bij->jb"}, (), 18, 1),
    "einsum_implicit_output": ("Einsum", {"a": X[0], "b": X[1].T.copy()}, {"equation": "ij,jk"}, (), 18, 1),
    "einsum_broadcast_batch": ("Einsum", {"a": X[:1], "b": rng.standard_normal((2, 4, 2)).astype(np.float32)}, {"equation": "bij,bjk->bik"}, (), 18, 1),
    "reverse_sequence": ("ReverseSequence", {"x": X, "l": I64(1, 3)}, {"time_axis": 1, "batch_axis": 0}, (), 18, 1),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_onnxruntime(case):
    op, inputs, attrs, initializers, opset, outputs = CASES[case]
    check_op(op, inputs, attrs=attrs, initializers=initializers, opset=opset, outputs=outputs, rtol=1e-5, atol=1e-5)


def test_slice_takes_runtime_starts():
    """Runtime starts/ends go to slice_by_index as tensors, clamped the ONNX way."""
    model = single_node_model("Slice", {"x": X, "s": I64(0), "e": I64(1)})
    check(model, {"x": X, "s": I64(0), "e": I64(1)})


def test_slice_runtime_starts_need_constant_steps():
    inputs = {"x": X, "s": I64(0), "e": I64(1), "a": I64(1), "st": I64(1)}
    model = single_node_model("Slice", inputs, initializers=("a",))
    with pytest.raises(LoweringError, match=r"'node' \(Slice\).*steps must be a constant"):
        check(model, inputs, initializers=("a",))


def test_mod_fmod0_on_floats_is_refused():
    model = single_node_model("Mod", {"a": X, "b": POS})
    with pytest.raises(LoweringError, match="fmod=1"):
        lower(model)


def test_shape_folds_to_a_constant():
    """A static Shape becomes a constant, so shape arithmetic leaves no ops behind."""
    result = lower(single_node_model("Shape", {"x": X}))
    assert result.op_counts == {"const": 1} or set(result.op_counts) <= {"const", "identity"}
