"""Indexing op lowerings against onnxruntime: gathers, scatters, OneHot, NonZero
(lowering/ops/gather.py). One-node models, lowered and run in edgebuild's MIL interpreter."""

from __future__ import annotations

import numpy as np
from onnx_cases import I64, X, op_table_test

rng = np.random.default_rng(8)

# (op, inputs, attrs, initializer names, opset, outputs)
CASES = {
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
}


test_matches_onnxruntime = op_table_test(CASES)
