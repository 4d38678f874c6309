"""``linear`` and ``matmul`` keep integer operands integer and compute anything else in float
(fp16 widened to fp32), over the operand dtypes and ranks a program hands them."""

from __future__ import annotations

import numpy as np
import pytest
from edgebuild_coreml.interpreter.ops_linear import linear, matmul

RNG = np.random.default_rng(3)


class _Op:
    """A stand-in for a MIL op: the evaluators read its type, name and defaults."""

    def __init__(self, op_type):
        self.op_type = self.name = op_type

    def default_inputs(self):
        return {}


def _values(dtype, shape):
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(0, 5, shape).astype(dtype)
    if np.dtype(dtype).kind == "b":
        return RNG.integers(0, 2, shape).astype(bool)
    return RNG.standard_normal(shape).astype(dtype)


DTYPES = [np.float32, np.float16, np.int32, np.int64, np.uint8, bool]


def _kind(result_dtype):
    return "int" if np.dtype(result_dtype).kind in "iu" else "float"


@pytest.mark.parametrize("x_dtype", DTYPES)
@pytest.mark.parametrize("w_dtype", DTYPES)
@pytest.mark.parametrize("x_shape", [(5,), (2, 5), (3, 2, 5)])
def test_linear_types_and_values(x_dtype, w_dtype, x_shape):
    x, weight = _values(x_dtype, x_shape), _values(w_dtype, (4, 5))
    got = linear(_Op("linear"), {"x": x, "weight": weight})
    ints = np.dtype(x_dtype).kind in "iu" and np.dtype(w_dtype).kind in "iu"
    assert _kind(got.dtype) == ("int" if ints else "float")
    if not ints:
        assert got.dtype == np.float32
    expected = x.astype(np.float64) @ weight.astype(np.float64).T
    np.testing.assert_allclose(got.astype(np.float64), expected, rtol=1e-5, atol=1e-5)
    assert got.shape == (*x_shape[:-1], 4)


@pytest.mark.parametrize("x_dtype", [np.float32, np.int32, np.float16])
def test_linear_adds_its_bias(x_dtype):
    x, weight = _values(x_dtype, (3, 5)), _values(np.float32, (4, 5))
    bias = RNG.standard_normal(4).astype(np.float32)
    got = linear(_Op("linear"), {"x": x, "weight": weight, "bias": bias})
    np.testing.assert_allclose(got, x.astype(np.float64) @ weight.T.astype(np.float64) + bias, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("a_dtype", DTYPES)
@pytest.mark.parametrize("b_dtype", [np.float32, np.int32, np.int64])
@pytest.mark.parametrize("transpose", [(False, False), (True, False), (False, True)])
def test_matmul_types_and_values(a_dtype, b_dtype, transpose):
    a = _values(a_dtype, (2, 5, 3) if transpose[0] else (2, 3, 5))
    b = _values(b_dtype, (4, 5) if transpose[1] else (5, 4))
    got = matmul(_Op("matmul"), {"x": a, "y": b, "transpose_x": np.bool_(transpose[0]),
                                 "transpose_y": np.bool_(transpose[1])})
    ints = np.dtype(a_dtype).kind in "iu" and np.dtype(b_dtype).kind in "iu"
    assert _kind(got.dtype) == ("int" if ints else "float")
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    expected = (np.swapaxes(a64, -1, -2) if transpose[0] else a64) @ (b64.T if transpose[1] else b64)
    np.testing.assert_allclose(got.astype(np.float64), expected, rtol=1e-5, atol=1e-5)
