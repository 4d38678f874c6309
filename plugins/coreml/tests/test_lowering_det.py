"""Det (lowering/ops/det.py) against onnxruntime: closed forms for 1x1 and 2x2, the unrolled
pivoting LU beyond, batches, singular matrices and row swaps."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_cases import check_op, rand


@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (3, 3), (4, 4), (6, 6), (5, 3, 3), (2, 3, 4, 4)])
def test_det_matches_onnxruntime(shape):
    check_op("Det", {"x": rand(*shape, seed=sum(shape))}, rtol=1e-4, atol=1e-5)


def test_det_of_singular_and_permuted_matrices():
    singular = np.array([[1, 2, 3], [2, 4, 6], [1, 0, 1]], np.float32)  # rows 0 and 1 are dependent
    zero_first_pivot = np.array([[0, 1, 2], [3, 0, 1], [1, 4, 0]], np.float32)  # needs a row swap
    permutation = np.eye(4, dtype=np.float32)[[2, 0, 3, 1]]
    zero_column = np.array([[0, 1, 2], [0, 5, 1], [0, 4, 7]], np.float32)
    for matrix in (singular, zero_first_pivot, zero_column):
        check_op("Det", {"x": matrix}, atol=1e-5)
    check_op("Det", {"x": permutation}, atol=1e-6)


def test_det_fp16():
    check_op("Det", {"x": rand(2, 3, 3, seed=3).astype(np.float16)}, rtol=1e-2, atol=1e-2)
