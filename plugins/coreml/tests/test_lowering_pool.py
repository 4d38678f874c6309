"""Pooling lowerings against onnxruntime: max, average, Lp and global pools (lowering/ops/pool.py).

Each case builds a small ONNX model, lowers it to MIL, runs the program in edgebuild's MIL
interpreter and compares on the same random inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx_cases import assert_matches, check_op, lower_and_run, rand, run_onnxruntime, single_node_model

RTOL, ATOL = 1e-4, 1e-5
X4 = rand(2, 3, 9, 8, seed=1)

POOL_CASES = [
    {"kernel_shape": [3, 3]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 0], "ceil_mode": 1},
    {"kernel_shape": [2, 3], "strides": [2, 1], "auto_pad": "SAME_UPPER"},
    {"kernel_shape": [3, 2], "strides": [2, 3], "auto_pad": "SAME_LOWER"},
    {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 0, 0, 1]},
    {"kernel_shape": [2, 2], "dilations": [2, 1], "strides": [2, 2], "ceil_mode": 1},
]


@pytest.mark.parametrize("attrs", POOL_CASES, ids=str)
def test_max_pool(attrs):
    check_op("MaxPool", {"x": X4}, attrs=attrs, opset=12, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("attrs", POOL_CASES, ids=str)
@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool(attrs, include_pad):
    check_op("AveragePool", {"x": X4}, attrs={**attrs, "count_include_pad": include_pad}, opset=19, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("attrs", [POOL_CASES[1], POOL_CASES[3], POOL_CASES[6]], ids=str)
def test_max_pool_indices(attrs, storage_order):
    x = rand(2, 3, 9, 8, seed=7)
    check_op("MaxPool", {"x": x}, attrs={**attrs, "storage_order": storage_order}, opset=12, outputs=2)


def test_pool_1d_and_3d():
    check_op("MaxPool", {"x": rand(2, 3, 11)}, attrs={"kernel_shape": [3], "strides": [2], "ceil_mode": 1}, opset=12)
    check_op("AveragePool", {"x": rand(1, 2, 5, 6, 7)}, attrs={"kernel_shape": [2, 3, 2], "pads": [1, 1, 0, 0, 1, 1]},
             opset=11, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool(p):
    check_op("LpPool", {"x": X4}, attrs={"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1], "p": p},
             opset=18, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
def test_global_pool(op):
    check_op(op, {"x": X4}, opset=13, rtol=RTOL, atol=ATOL)


def test_pool_fp16():
    model = single_node_model("AveragePool", {"x": X4}, attrs={"kernel_shape": [3, 3], "ceil_mode": 1, "strides": [2, 2]},
                              opset=19)
    expected = run_onnxruntime(model, {"x": X4})["y"]
    assert_matches(lower_and_run(model, {"x": X4}, precision="float16")["y"], expected, rtol=1e-2, atol=1e-2)


def test_max_pool_uint8():
    x = np.random.default_rng(8).integers(0, 256, (1, 2, 5, 5)).astype(np.uint8)
    check_op("MaxPool", {"x": x}, attrs={"kernel_shape": [2, 2], "strides": [1, 2]}, opset=12)
