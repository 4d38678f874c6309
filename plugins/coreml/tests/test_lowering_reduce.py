"""Reduction op lowerings against onnxruntime: Reduce*, ArgMax, ArgMin (lowering/ops/reduce.py).
One-node models, lowered and run in edgebuild's MIL interpreter."""

from __future__ import annotations

import numpy as np
from onnx_cases import I64, X, op_table_test

POS = (np.abs(X) + 0.1).astype(np.float32)

# (op, inputs, attrs, initializer names, opset, outputs)
CASES = {
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
}


test_matches_onnxruntime = op_table_test(CASES)
