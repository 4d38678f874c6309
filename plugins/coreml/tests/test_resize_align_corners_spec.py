"""align_corners with a scale that does not give a whole length (lowering/ops/_resize_weights.py).

The spec's formula is x_original = x_resized * (length_original - 1) / (length_resized - 1) with
length_resized = scale * length_original, unfloored; onnx's reference evaluator computes exactly
that, while onnxruntime's CPU kernel divides by the floored output length instead (scale 1.5 on
length 5 puts the last sample at 3.69 in the spec, 4 in onnxruntime: up to 0.47 apart on random
data). The lowering follows the spec; where scale * length is whole the two agree, and there it
matches onnxruntime too.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest
from onnx.reference import ReferenceEvaluator
from onnx_cases import IR_VERSION, assert_matches, lower_and_run, rand, run_onnxruntime

LENGTHS = (2, 3, 5, 8)
SCALES = (0.6, 1.5, 1.7, 2.0, 2.5, 3.0)
MODES = ("linear", "cubic", "nearest")


def _model(length: int, scale: float, mode: str) -> onnx.ModelProto:
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, length, length + 1])
    node = oh.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode, coordinate_transformation_mode="align_corners")
    scales = onh.from_array(np.array([1, 1, scale, scale], dtype=np.float32), "scales")
    graph = oh.make_graph([node], "case", [x], [onnx.ValueInfoProto(name="y")], [scales])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 19)], ir_version=IR_VERSION)


def _whole(length: int, scale: float) -> bool:
    return all(float(np.float32(scale)) * n == int(float(np.float32(scale)) * n) for n in (length, length + 1))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("scale", SCALES)
def test_follows_the_spec(scale, mode):
    for length in LENGTHS:
        model = _model(length, scale, mode)
        x = rand(1, 2, length, length + 1, seed=length)
        expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
        assert_matches(lower_and_run(model, {"x": x})["y"], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_matches_onnxruntime_where_the_length_is_whole(mode):
    checked = 0
    for scale in SCALES:
        for length in LENGTHS:
            if not _whole(length, scale):
                continue
            model = _model(length, scale, mode)
            x = rand(1, 2, length, length + 1, seed=length)
            assert_matches(lower_and_run(model, {"x": x})["y"], run_onnxruntime(model, {"x": x})["y"], rtol=1e-4, atol=1e-5)
            checked += 1
    assert checked >= 4


def test_the_reported_case_differs_from_onnxruntime_by_its_divisor():
    """Scale 1.5 on length 5: the spec's last sample is 6 * 4 / 6.5, onnxruntime's 6 * 4 / 6."""
    x = np.arange(5, dtype=np.float32).reshape(1, 1, 1, 5)
    node = oh.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear", coordinate_transformation_mode="align_corners")
    graph = oh.make_graph([node], "case", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1, 1, 5])],
                          [onnx.ValueInfoProto(name="y")],
                          [onh.from_array(np.array([1, 1, 1, 1.5], dtype=np.float32), "scales")])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 19)], ir_version=IR_VERSION)
    ours = lower_and_run(model, {"x": x})["y"].reshape(-1)
    assert ours.shape == (7,)
    np.testing.assert_allclose(ours, np.arange(7) * 4 / 6.5, rtol=1e-5, atol=1e-5)
