"""Resize whose batch is known only at run time (Keypoint R-CNN's roi count; lowering/ops/resize.py).

The resized axes are static, so their sampling grids are computed at build time, and the run-time
axis stays as it is. Each case runs in the MIL interpreter against onnxruntime at several batches,
over modes and coordinate modes, with the batch both a symbolic input dim and a count computed in
the graph; a run-time axis that is resized has its grid built in the graph instead.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest
from onnx_cases import IR_VERSION, assert_matches, lower_and_run, rand, run_onnxruntime

RTOL, ATOL = 1e-4, 1e-5
BATCHES = (1, 3, 0)
SHAPE = (2, 5, 6)  # channels and spatial dims, after the run-time batch

# (mode, coordinate_transformation_mode, scales of [N, C, H, W])
CASES = {
    "bilinear_half_pixel_x2": ("linear", "half_pixel", [1, 1, 2, 2]),  # Keypoint R-CNN's upsampling
    "bilinear_align_corners": ("linear", "align_corners", [1, 1, 2, 3]),
    "bilinear_asymmetric_down": ("linear", "asymmetric", [1, 1, 0.5, 0.7]),
    "nearest_x2": ("nearest", "asymmetric", [1, 1, 2, 2]),
    "nearest_x3x2": ("nearest", "half_pixel", [1, 1, 3, 2]),
    "cubic": ("cubic", "pytorch_half_pixel", [1, 1, 2, 1.5]),
    "channels_too": ("nearest", "asymmetric", [1, 2, 2, 1]),
}


def _model(nodes, inputs, initializers) -> onnx.ModelProto:
    graph = oh.make_graph(nodes, "case", inputs, [onnx.ValueInfoProto(name="y")], initializers)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=IR_VERSION)
    return onnx.shape_inference.infer_shapes(model)


def _resize(source: str, mode: str, coordinates: str, scales) -> tuple[onnx.NodeProto, onnx.TensorProto]:
    node = oh.make_node("Resize", [source, "", "scales"], ["y"], mode=mode,
                        coordinate_transformation_mode=coordinates)
    return node, onh.from_array(np.asarray(scales, dtype=np.float32), "scales")


def symbolic_batch(mode, coordinates, scales) -> onnx.ModelProto:
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", *SHAPE])
    node, init = _resize("x", mode, coordinates, scales)
    return _model([node], [x], [init])


def counted_batch(mode, coordinates, scales, rows: int) -> onnx.ModelProto:
    """The rows of x kept by ``keep`` (a run-time count, as after NMS) are resized."""
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [rows, *SHAPE])
    keep = oh.make_tensor_value_info("keep", onnx.TensorProto.BOOL, [rows])
    node, init = _resize("kept", mode, coordinates, scales)
    nodes = [oh.make_node("NonZero", ["keep"], ["where"]), oh.make_node("Squeeze", ["where", "axis"], ["index"]),
             oh.make_node("Gather", ["x", "index"], ["kept"], axis=0), node]
    return _model(nodes, [x, keep], [init, onh.from_array(np.array([0], dtype=np.int64), "axis")])


def _compare(model, feeds):
    expected = run_onnxruntime(model, feeds)["y"]
    actual = lower_and_run(model, feeds)["y"]
    assert actual.shape == expected.shape
    assert_matches(actual, expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", sorted(CASES))
def test_symbolic_batch(case):
    model = symbolic_batch(*CASES[case])
    for batch in BATCHES:
        _compare(model, {"x": rand(batch, *SHAPE, seed=batch)})


@pytest.mark.parametrize("case", sorted(CASES))
def test_batch_counted_in_the_graph(case):
    rows = 4
    model = counted_batch(*CASES[case], rows)
    for kept in ([True, False, True, True], [False] * rows, [True] * rows):
        _compare(model, {"x": rand(rows, *SHAPE, seed=5), "keep": np.array(kept)})


def test_a_run_time_axis_that_is_resized_builds_its_grid_in_the_graph():
    # the batch axis itself resized: its grid cannot be computed at build time (test_resize_runtime_sizes.py)
    model = symbolic_batch("nearest", "asymmetric", [2, 1, 2, 2])
    for batch in BATCHES:
        _compare(model, {"x": rand(batch, *SHAPE, seed=batch)})


def test_sizes_with_a_run_time_axis_build_their_grid_in_the_graph():
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", *SHAPE])
    node = oh.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest")
    sizes = onh.from_array(np.array([1, 2, 10, 12], dtype=np.int64), "sizes")
    model = _model([node], [x], [sizes])
    for batch in (1, 3):
        _compare(model, {"x": rand(batch, *SHAPE, seed=batch)})
