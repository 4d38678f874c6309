"""BitwiseAnd/Or/Xor/Not (lowering/ops/bitwise.py) against onnxruntime, across integer widths,
signs, extremes and broadcasting: the int32 bit arithmetic must be exact."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_cases import check_op

_TYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.int64]


def _values(dtype, shape, seed):
    """Random values over the type's range (int32's for 64-bit types), extremes included."""
    info = np.iinfo(dtype)
    low, high = max(info.min, np.iinfo(np.int32).min), min(info.max, np.iinfo(np.int32).max)
    values = np.random.default_rng(seed).integers(low, high, size=shape, endpoint=True, dtype=np.int64)
    flat = values.reshape(-1)
    flat[:4] = [low, high, 0, -1 if low < 0 else 1]
    return values.astype(dtype)


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize("dtype", _TYPES, ids=lambda t: np.dtype(t).name)
def test_binary_matches_onnxruntime(op, dtype):
    check_op(op, {"a": _values(dtype, (3, 4, 5), 1), "b": _values(dtype, (4, 5), 2)})


@pytest.mark.parametrize("dtype", _TYPES, ids=lambda t: np.dtype(t).name)
def test_not_matches_onnxruntime(dtype):
    check_op("BitwiseNot", {"x": _values(dtype, (2, 3, 4), 3)})


def test_uint32_values_within_int32():
    a = np.array([0, 1, 0x7FFF_FFFF, 0x1234_5678], np.uint32)
    b = np.array([0x7FFF_FFFF, 3, 0x0F0F_0F0F, 0x7654_3210], np.uint32)
    for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
        check_op(op, {"a": a, "b": b})
