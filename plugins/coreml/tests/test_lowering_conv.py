"""Conv and ConvTranspose lowerings against onnxruntime (lowering/ops/conv.py).

Each case builds a small ONNX model, lowers it to MIL, runs the program in edgebuild's MIL
interpreter and compares on the same random inputs.
"""

from __future__ import annotations

import pytest
from onnx_cases import assert_matches, check_op, lower_and_run, rand, run_onnxruntime, single_node_model

RTOL, ATOL = 1e-4, 1e-5

CONV_CASES = [
    ({}, (1, 6, 10, 9), (4, 6, 3, 3)),
    ({"pads": [1, 0, 2, 1], "strides": [2, 1]}, (1, 6, 10, 9), (4, 6, 3, 3)),
    ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, (1, 6, 10, 9), (4, 6, 3, 2)),
    ({"auto_pad": "SAME_LOWER", "strides": [2, 3]}, (1, 6, 10, 9), (4, 6, 4, 3)),
    ({"auto_pad": "VALID", "dilations": [2, 1]}, (1, 6, 10, 9), (4, 6, 3, 3)),
    ({"group": 2, "pads": [1, 1, 1, 1]}, (2, 6, 10, 9), (4, 3, 3, 3)),
    ({"group": 6}, (1, 6, 10, 9), (6, 1, 3, 3)),
    ({"pads": [2, 1], "strides": [2]}, (1, 6, 11), (4, 6, 3)),
    ({"pads": [1, 0, 1, 0, 1, 1]}, (1, 2, 5, 6, 4), (3, 2, 2, 3, 2)),
]


@pytest.mark.parametrize("attrs,x_shape,w_shape", CONV_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("with_bias", [True, False])
def test_conv(attrs, x_shape, w_shape, with_bias):
    inputs = {"x": rand(*x_shape), "w": rand(*w_shape, seed=1), "b": rand(w_shape[0], seed=2) if with_bias else None}
    check_op("Conv", inputs, attrs=attrs, opset=11, initializers=("w", "b"), rtol=RTOL, atol=ATOL)


def test_conv_runtime_weight_and_bias():
    inputs = {"x": rand(1, 4, 7, 7), "w": rand(5, 4, 3, 3, seed=1), "b": rand(5, seed=2)}
    check_op("Conv", inputs, attrs={"pads": [1, 1, 1, 1]}, opset=11, rtol=RTOL, atol=ATOL)


CONV_TRANSPOSE_CASES = [
    ({"strides": [2, 2]}, (1, 4, 5, 6), (4, 3, 3, 3)),
    ({"strides": [2, 2], "pads": [1, 0, 1, 2]}, (1, 4, 5, 6), (4, 3, 3, 3)),
    ({"strides": [2, 3], "output_padding": [1, 2], "pads": [1, 1, 0, 0]}, (1, 4, 5, 6), (4, 3, 3, 3)),
    ({"strides": [2, 2], "output_shape": [11, 13]}, (1, 4, 5, 6), (4, 3, 3, 3)),
    ({"strides": [2, 2], "auto_pad": "SAME_UPPER"}, (1, 4, 5, 6), (4, 3, 3, 3)),
    ({"strides": [2, 2], "auto_pad": "SAME_LOWER"}, (1, 4, 5, 6), (4, 3, 3, 3)),
    ({"group": 2, "dilations": [2, 1], "strides": [1, 2]}, (1, 4, 5, 6), (4, 2, 3, 2)),
    ({"strides": [3], "output_padding": [2]}, (1, 4, 7), (4, 2, 3)),
]


@pytest.mark.parametrize("attrs,x_shape,w_shape", CONV_TRANSPOSE_CASES, ids=lambda v: str(v))
def test_conv_transpose(attrs, x_shape, w_shape):
    out_channels = w_shape[1] * attrs.get("group", 1)
    inputs = {"x": rand(*x_shape), "w": rand(*w_shape, seed=1), "b": rand(out_channels, seed=2)}
    check_op("ConvTranspose", inputs, attrs=attrs, opset=11, initializers=("w", "b"), rtol=RTOL, atol=ATOL)


def test_conv_fp16():
    x, w = rand(1, 4, 8, 8), rand(6, 4, 3, 3, seed=1)
    model = single_node_model("Conv", {"x": x, "w": w}, attrs={"pads": [1, 1, 1, 1]}, opset=11, initializers=("w",))
    expected = run_onnxruntime(model, {"x": x})["y"]
    assert_matches(lower_and_run(model, {"x": x}, precision="float16")["y"], expected, rtol=2e-2, atol=2e-2)
