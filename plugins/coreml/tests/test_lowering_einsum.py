"""Einsum lowerings against onnxruntime and numpy, ellipses and diagonals included
(lowering/ops/einsum.py). One-node models, lowered and run in edgebuild's MIL interpreter."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_cases import X, assert_matches, lower_and_run, op_table_test, rand, single_node_model

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


@pytest.mark.parametrize("equation,shapes", [
    ("...ii->...i", [(3, 5, 5)]),
    ("i,i", [(5,), (5,)]),
    ("ii", [(4, 4)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("...ij,...jk", [(2, 3, 4), (4, 2)]),
    ("bii,bj->bij", [(2, 3, 3), (2, 4)]),
    ("ij->", [(3, 4)]),
])
def test_einsum(equation, shapes):
    inputs = {f"x{k}": rand(*shape, seed=20 + k) for k, shape in enumerate(shapes)}
    model = single_node_model("Einsum", inputs, attrs={"equation": equation}, opset=12)
    out = lower_and_run(model, inputs)
    assert_matches(out["y"], np.einsum(equation, *inputs.values()), rtol=1e-4, atol=1e-5)
