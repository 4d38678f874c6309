"""Unique (lowering/ops/unique.py) against onnxruntime: all four outputs, sorted and in order of
first occurrence, flattened and along an axis (lexicographic order of slices), with ties."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_cases import check_op

_INTS = np.array([[3, -1, 3, 0], [2, 2, -1, 7], [3, -1, 3, 0]], np.int64)
_FLOATS = np.array([2.5, -1.0, 2.5, 0.0, 7.25, -1.0, 3.0, 0.0], np.float32)
_SLICES = np.array([[[1, 0], [1, 0], [0, 2]], [[1, 0], [1, 0], [0, 2]], [[0, 5], [1, 1], [0, 2]]], np.float32)


@pytest.mark.parametrize("sorted_", [1, 0])
@pytest.mark.parametrize("x, axis", [
    (_FLOATS, None), (_INTS, None), (_INTS, 0), (_INTS, 1), (_INTS, -1), (_SLICES, 0), (_SLICES, 1), (_SLICES, 2),
    (np.array([4.0], np.float32), None), (np.full((2, 3), 5, np.int64), None),
], ids=["floats", "ints", "rows", "columns", "last_axis", "3d_axis0", "3d_axis1", "3d_axis2", "one", "all_same"])
def test_unique_matches_onnxruntime(x, axis, sorted_):
    attrs = {"sorted": sorted_} if axis is None else {"sorted": sorted_, "axis": axis}
    check_op("Unique", {"x": x}, attrs=attrs, outputs=4, opset=11)
