"""Gemm, MatMul and MatMulInteger lowerings against onnxruntime (lowering/ops/gemm.py).

Each case builds a small ONNX model, lowers it to MIL, runs the program in edgebuild's MIL
interpreter and compares on the same random inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx_cases import assert_matches, check_op, lower_and_run, rand, run_onnxruntime, single_node_model

RTOL, ATOL = 1e-4, 1e-5


@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("const_b", [True, False])
@pytest.mark.parametrize("c_shape", [None, (5,), (1, 5), (4, 5), ()])
def test_gemm(trans_a, trans_b, const_b, c_shape):
    a = rand(*((6, 4) if trans_a else (4, 6)), seed=3)
    b = rand(*((5, 6) if trans_b else (6, 5)), seed=4)
    inputs = {"a": a, "b": b, "c": None if c_shape is None else rand(*c_shape, seed=5)}
    attrs = {"transA": trans_a, "transB": trans_b, "alpha": 0.5, "beta": 2.0}
    check_op("Gemm", inputs, attrs=attrs, opset=13, initializers=("b", "c") if const_b else ("c",) if c_shape == () else (), rtol=RTOL, atol=ATOL)


def test_gemm_runtime_c():
    check_op("Gemm", {"a": rand(4, 6), "b": rand(6, 5, seed=1), "c": rand(4, 5, seed=2)}, attrs={"beta": 0.5},
             opset=13, initializers=("b",), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("a_shape,b_shape,const_b", [
    ((2, 3, 4, 6), (6, 5), True), ((2, 3, 4, 6), (6, 5), False), ((3, 4, 6), (3, 6, 5), False),
    ((6,), (6, 5), False), ((2, 4, 6), (6,), False), ((1, 4, 6), (2, 6, 5), False),
])
def test_matmul(a_shape, b_shape, const_b):
    check_op("MatMul", {"a": rand(*a_shape), "b": rand(*b_shape, seed=1)}, opset=13,
             initializers=("b",) if const_b else (), rtol=RTOL, atol=ATOL)


def test_matmul_integer():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 255, (3, 4)).astype(np.uint8)
    b = rng.integers(0, 255, (4, 5)).astype(np.uint8)
    check_op("MatMulInteger", {"a": a, "b": b, "az": np.uint8(12), "bz": np.uint8(200)}, opset=10,
             initializers=("b", "az", "bz"))


def test_gemm_fp16():
    a, b = rand(4, 6), rand(6, 5, seed=1)
    model = single_node_model("Gemm", {"a": a, "b": b}, opset=13, initializers=("b",))
    expected = run_onnxruntime(model, {"a": a})["y"]
    assert_matches(lower_and_run(model, {"a": a}, precision="float16")["y"], expected, rtol=1e-2, atol=1e-2)
