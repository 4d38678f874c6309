"""Einsum lowerings against onnxruntime (lowering/ops/einsum.py). One-node models, lowered and
run in edgebuild's MIL interpreter."""

from __future__ import annotations

import numpy as np
from onnx_cases import X, op_table_test

rng = np.random.default_rng(8)

# (op, inputs, attrs, initializer names, opset, outputs)
CASES = {
    # einsum
    "einsum_matmul": ("Einsum", {"a": X, "b": rng.standard_normal((2, 4, 5)).astype(np.float32)}, {"equation": "bij,bjk->bik"}, (), 18, 1),
    "einsum_outer_transposed": ("Einsum", {"a": X[0, 0], "b": X[1, 1]}, {"equation": "i,j->ji"}, (), 18, 1),
    "einsum_sum_out_and_contract": ("Einsum", {"a": X, "b": X}, {"equation": "bij,cij->bc"}, (), 18, 1),
    "einsum_single_transpose_sum": ("Einsum", {"a": X}, {"equation": "bij->jb"}, (), 18, 1),
    "einsum_implicit_output": ("Einsum", {"a": X[0], "b": X[1].T.copy()}, {"equation": "ij,jk"}, (), 18, 1),
    "einsum_broadcast_batch": ("Einsum", {"a": X[:1], "b": rng.standard_normal((2, 4, 2)).astype(np.float32)}, {"equation": "bij,bjk->bik"}, (), 18, 1),
}


test_matches_onnxruntime = op_table_test(CASES)
