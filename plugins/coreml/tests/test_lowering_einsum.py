"""Einsum lowerings against onnxruntime (lowering/ops/einsum.py).

Each case is a one-node ONNX model; the lowered MIL program runs in edgebuild's MIL
interpreter and must match onnxruntime's output.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx_cases import check_op

rng = np.random.default_rng(7)
X = rng.standard_normal((2, 3, 4)).astype(np.float32)

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


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_onnxruntime(case):
    op, inputs, attrs, initializers, opset, outputs = CASES[case]
    check_op(op, inputs, attrs=attrs, initializers=initializers, opset=opset, outputs=outputs, rtol=1e-5, atol=1e-5)
