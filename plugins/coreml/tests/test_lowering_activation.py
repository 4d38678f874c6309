"""Activation and softmax-family lowerings against onnxruntime (lowering/ops/activation.py,
softmax.py).

Each case builds a small ONNX model, lowers it to MIL, runs the program in edgebuild's MIL
interpreter and compares on the same random inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx_cases import assert_matches, check_op, lower, lower_and_run, rand, run_onnxruntime, single_node_model

RTOL, ATOL = 1e-4, 1e-5
X4 = rand(2, 3, 9, 8, seed=1)

# -- activations -------------------------------------------------------------------------
ACTIVATIONS = [
    ("Relu", {}, 14), ("LeakyRelu", {"alpha": 0.2}, 16), ("Elu", {"alpha": 0.7}, 6), ("Selu", {}, 6),
    ("Celu", {"alpha": 1.5}, 12), ("Sigmoid", {}, 13), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, 6),
    ("HardSwish", {}, 14), ("Softplus", {}, 1), ("Softsign", {}, 1), ("Tanh", {}, 13),
    ("ThresholdedRelu", {"alpha": 0.25}, 10), ("Gelu", {}, 20), ("Gelu", {"approximate": "tanh"}, 20),
    ("Mish", {}, 18), ("Shrink", {"lambd": 0.3, "bias": 0.1}, 9),
]


@pytest.mark.parametrize("op,attrs,opset", ACTIVATIONS, ids=lambda v: str(v))
def test_activation(op, attrs, opset):
    check_op(op, {"x": X4 * 3}, attrs=attrs, opset=opset, rtol=RTOL, atol=ATOL)


def test_thresholded_relu_drops_values_equal_to_alpha():
    x = np.array([[0.5, 1.0, 1.5]], np.float32)
    check_op("ThresholdedRelu", {"x": x}, attrs={"alpha": 1.0}, opset=10)


@pytest.mark.parametrize("slope_shape", [(1,), (3, 1, 1), (8,)])
def test_prelu_broadcasts_slope(slope_shape):
    check_op("PRelu", {"x": X4, "slope": rand(*slope_shape, seed=2)}, opset=16, initializers=("slope",))


def test_prelu_runtime_slope():
    check_op("PRelu", {"x": X4, "slope": rand(3, 1, 1, seed=2)}, opset=16)


@pytest.mark.parametrize("low,high", [(0.0, 6.0), (0.0, None), (-0.5, 0.25), (None, 0.1), (0.7, 0.2)])
def test_clip_inputs(low, high):
    inputs = {"x": X4 * 8, "min": None if low is None else np.float32(low), "max": None if high is None else np.float32(high)}
    if low is None:
        inputs = {"x": X4 * 8, "min": None, "max": np.float32(high)}
    check_op("Clip", inputs, opset=13, initializers=("min", "max"))


def test_clip_attributes_before_opset_11():
    check_op("Clip", {"x": X4 * 8}, attrs={"min": -1.0, "max": 2.0}, opset=6)


def test_clip_int():
    ints = (X4 * 10).astype(np.int32)
    check_op("Clip", {"x": ints, "min": np.int32(-2), "max": np.int32(4)}, opset=13, initializers=("min", "max"))


def test_clip_relu6_is_a_single_op():
    model = single_node_model("Clip", {"x": X4, "lo": np.float32(0), "hi": np.float32(6)}, opset=13,
                              initializers=("lo", "hi"))
    assert lower(model).op_counts.get("relu6") == 1


def test_activation_fp16():
    x = X4 * 3
    model = single_node_model("HardSwish", {"x": x}, opset=14)
    expected = run_onnxruntime(model, {"x": x})["y"]
    actual = lower_and_run(model, {"x": x}, precision="float16")["y"]
    assert_matches(actual, expected, rtol=1e-2, atol=1e-2)


# -- softmax family ----------------------------------------------------------------------
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset,axis", [(11, 1), (11, 2), (11, -1), (13, 1), (13, -1), (13, 0)])
def test_softmax_family(op, opset, axis):
    check_op(op, {"x": X4 * 4}, attrs={"axis": axis}, opset=opset, rtol=RTOL, atol=ATOL)


def test_softmax_opset11_default_axis_coerces_to_2d():
    check_op("Softmax", {"x": X4 * 4}, opset=11, rtol=RTOL, atol=ATOL)
