"""Normalisation lowerings against onnxruntime (or the ONNX formula or reference evaluator where
it refuses): batch (training mode too), instance, layer, group, Lp, LRN, mean-variance
(lowering/ops/norm.py).

Each case builds a small ONNX model, lowers it to MIL, runs the program in edgebuild's MIL
interpreter and compares on the same random inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx_cases import assert_matches, check_op, check_reference, lower_and_run, rand, run_onnxruntime, single_node_model

RTOL, ATOL = 1e-4, 1e-5
X4 = rand(2, 3, 9, 8, seed=1)


def test_batch_normalization():
    c = X4.shape[1]
    inputs = {"x": X4, "s": rand(c, seed=2), "b": rand(c, seed=3), "m": rand(c, seed=4), "v": rand(c, seed=5, low=0.1)}
    check_op("BatchNormalization", inputs, opset=15, initializers=("s", "b", "m", "v"), rtol=RTOL, atol=ATOL)
    check_op("BatchNormalization", inputs, opset=15, rtol=RTOL, atol=ATOL)  # runtime statistics
    flat = {**inputs, "x": rand(4, c, seed=6)}
    check_op("BatchNormalization", flat, opset=15, initializers=("s", "b", "m", "v"), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("epsilon,momentum", [(1e-5, 0.9), (1e-2, 0.6)])
def test_batch_norm_training_mode(epsilon, momentum):
    inputs = {"x": rand(2, 3, 4, 5, seed=9), "scale": rand(3, seed=10), "bias": rand(3, seed=11),
              "mean": rand(3, seed=12), "var": rand(3, seed=13, low=0.1, high=1.0)}
    model = single_node_model("BatchNormalization", inputs, outputs=["y", "running_mean", "running_var"], opset=15,
                              attrs={"training_mode": 1, "epsilon": epsilon, "momentum": momentum})
    check_reference(model, inputs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [(2, 3, 9, 8), (2, 3, 7), (1, 3, 4, 5, 3)])
def test_instance_normalization(shape):
    inputs = {"x": rand(*shape), "s": rand(3, seed=2), "b": rand(3, seed=3)}
    check_op("InstanceNormalization", inputs, opset=6, initializers=("s", "b"), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("axis", [-1, 1, 2])
def test_layer_normalization(axis):
    scale_shape = X4.shape[axis:]
    inputs = {"x": X4, "s": rand(*scale_shape, seed=2), "b": rand(*scale_shape, seed=3)}
    check_op("LayerNormalization", inputs, attrs={"axis": axis, "epsilon": 1e-3}, opset=17,
             initializers=("s", "b"), rtol=RTOL, atol=ATOL)


def test_layer_normalization_stats_and_broadcast_scale():
    inputs = {"x": X4, "s": rand(1, 8, seed=2), "b": None}
    check_op("LayerNormalization", inputs, attrs={"axis": 2}, opset=17, outputs=3, initializers=("s",),
             rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("opset", [18, 21])
def test_group_normalization(opset):
    x = rand(2, 6, 5, 4)
    size = 3 if opset < 21 else 6
    inputs = {"x": x, "s": rand(size, seed=2), "b": rand(size, seed=3)}
    model = single_node_model("GroupNormalization", inputs, attrs={"num_groups": 3, "epsilon": 1e-4}, opset=opset,
                              initializers=("s", "b"))
    # the reference: per-group statistics, then the opset's affine
    grouped = x.reshape(2, 3, -1)
    normed = ((grouped - grouped.mean(-1, keepdims=True)) / np.sqrt(grouped.var(-1, keepdims=True) + 1e-4))
    if opset < 21:
        expected = (normed * inputs["s"].reshape(1, 3, 1) + inputs["b"].reshape(1, 3, 1)).reshape(x.shape)
    else:
        expected = normed.reshape(x.shape) * inputs["s"].reshape(1, 6, 1, 1) + inputs["b"].reshape(1, 6, 1, 1)
    assert_matches(lower_and_run(model, {"x": x})["y"], expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("p,axis", [(1, 1), (2, -1), (2, 0)])
def test_lp_normalization(p, axis):
    check_op("LpNormalization", {"x": X4}, attrs={"p": p, "axis": axis}, opset=1, rtol=RTOL, atol=ATOL)


def test_lp_normalization_of_zero_slice_is_zero():
    x = np.array([[0.0, 3.0, 0.0], [0.0, 4.0, 1.0]], np.float32)
    out = check_op("LpNormalization", {"x": x}, attrs={"axis": 0, "p": 2}, opset=1)
    assert np.isfinite(out["y"]).all()


def test_lrn():
    check_op("LRN", {"x": X4 * 3}, attrs={"size": 3, "alpha": 0.01, "beta": 0.6, "bias": 1.5}, opset=13,
             rtol=RTOL, atol=ATOL)


def test_lrn_even_size_window_is_asymmetric():
    """onnxruntime refuses even sizes; the reference is the ONNX formula in numpy."""
    x = X4 * 3
    model = single_node_model("LRN", {"x": x}, attrs={"size": 4, "alpha": 0.01, "beta": 0.6, "bias": 1.5}, opset=13)
    padded = np.pad(x * x, [(0, 0), (1, 2), (0, 0), (0, 0)])
    window = sum(padded[:, i:i + x.shape[1]] for i in range(4))
    expected = x / (1.5 + 0.01 / 4 * window) ** 0.6
    assert_matches(lower_and_run(model, {"x": x})["y"], expected, rtol=RTOL, atol=ATOL)


def test_mean_variance_normalization():
    check_op("MeanVarianceNormalization", {"x": X4}, opset=13, rtol=RTOL, atol=ATOL)
    check_op("MeanVarianceNormalization", {"x": X4}, attrs={"axes": [1, 3]}, opset=13, rtol=RTOL, atol=ATOL)


def test_normalization_fp16():
    inputs = {"x": X4, "s": rand(8, seed=2), "b": rand(8, seed=3)}
    model = single_node_model("LayerNormalization", inputs, opset=17, initializers=("s", "b"))
    expected = run_onnxruntime(model, {"x": X4})["y"]
    assert_matches(lower_and_run(model, {"x": X4}, precision="float16")["y"], expected, rtol=2e-2, atol=2e-2)
