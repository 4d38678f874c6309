"""Resize and Upsample lowerings against onnxruntime (or the ONNX reference evaluator where
onnxruntime departs from the spec) (lowering/ops/resize.py).

Each case builds a small ONNX model, lowers it to MIL, runs the program in edgebuild's MIL
interpreter and compares on the same random inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator
from onnx_cases import assert_matches, check, check_op, check_reference, feeds_of, lower, lower_and_run, rand, run_onnxruntime, single_node_model

RTOL, ATOL = 1e-4, 1e-5

RESIZE_X = rand(1, 2, 5, 7, seed=11)
RESIZE_GEOMETRY = {
    "up": {"scales": np.array([1, 1, 2, 3], np.float32)},
    "down": {"scales": np.array([1, 1, 0.6, 0.5], np.float32)},
    "fractional": {"scales": np.array([1, 1, 1.7, 0.8], np.float32)},
    "sizes": {"sizes": np.array([1, 2, 9, 5], np.int64)},
}
COORDINATE_MODES = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                    "tf_crop_and_resize"]
RESIZE_GRID = [(m, c, n, g) for m in ("nearest", "linear", "cubic") for c in COORDINATE_MODES
               for n in (["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"] if m == "nearest" else [None])
               for g in RESIZE_GEOMETRY]


@pytest.mark.parametrize("mode,coordinate_mode,nearest_mode,geometry", RESIZE_GRID, ids=str)
def test_resize_modes_grid(mode, coordinate_mode, nearest_mode, geometry):
    roi = np.array([0, 0, 0.1, 0.2, 1, 1, 0.8, 1.1], np.float32) if coordinate_mode == "tf_crop_and_resize" else None
    inputs = {"x": RESIZE_X, "roi": roi, "scales": None, "sizes": None, **RESIZE_GEOMETRY[geometry]}
    attrs = {"mode": mode, "coordinate_transformation_mode": coordinate_mode, "extrapolation_value": -3.0}
    if nearest_mode:
        attrs["nearest_mode"] = nearest_mode
    constants = ("roi", "scales", "sizes")
    if coordinate_mode in ("align_corners", "tf_crop_and_resize") and geometry in ("down", "fractional"):
        # The spec's length_resized is scale * length_original, fractional here; onnxruntime
        # uses the floored output size instead, so the spec's reference evaluator decides.
        model = single_node_model("Resize", inputs, attrs=attrs, opset=13, initializers=constants)
        feeds = feeds_of(inputs, constants)
        expected = ReferenceEvaluator(model).run(None, feeds)[0]
        assert_matches(lower_and_run(model, feeds)["y"], expected, rtol=RTOL, atol=ATOL)
        return
    check_op("Resize", inputs, attrs=attrs, opset=13, initializers=constants, rtol=RTOL, atol=ATOL)


RESIZE_OPTIONS = [
    ({"mode": "linear", "antialias": 1}, {"scales": np.array([1, 1, 0.5, 0.4], np.float32)}),
    ({"mode": "cubic", "antialias": 1}, {"scales": np.array([1, 1, 0.5, 0.4], np.float32)}),
    ({"mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": -0.5}, {"scales": np.array([1, 1, 1.5, 0.7], np.float32)}),
    ({"mode": "linear", "axes": [3, 2]}, {"scales": np.array([0.7, 1.5], np.float32)}),
    ({"mode": "linear", "keep_aspect_ratio_policy": "not_larger", "axes": [2, 3]}, {"sizes": np.array([5, 8], np.int64)}),
    ({"mode": "nearest", "keep_aspect_ratio_policy": "not_smaller", "axes": [2, 3]}, {"sizes": np.array([5, 8], np.int64)}),
]


@pytest.mark.parametrize("attrs,extra", RESIZE_OPTIONS, ids=str)
def test_resize_options_opset18(attrs, extra):
    inputs = {"x": rand(1, 2, 9, 11, seed=12), "roi": None, "scales": None, "sizes": None, **extra}
    check_op("Resize", inputs, attrs=attrs, opset=18, initializers=("roi", "scales", "sizes"), rtol=RTOL, atol=ATOL)


def test_resize_integer_nearest_upsample_is_one_op():
    inputs = {"x": RESIZE_X, "roi": None, "scales": np.array([1, 1, 2, 2], np.float32)}
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    model = single_node_model("Resize", inputs, attrs=attrs, opset=13, initializers=("scales",))
    assert lower(model).op_counts.get("upsample_nearest_neighbor") == 1
    check(model, inputs, initializers=("scales",))


@pytest.mark.parametrize("op,opset", [("Resize", 10), ("Upsample", 9)])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_opset10_and_upsample(op, opset, mode):
    inputs = {"x": rand(1, 2, 9, 11), "scales": np.array([1, 1, 2, 1.5], np.float32)}
    check_op(op, inputs, attrs={"mode": mode}, opset=opset, initializers=("scales",), rtol=RTOL, atol=ATOL)


def test_resize_runtime_sizes_build_their_grid_in_the_graph():
    # sizes fed at run time (test_resize_runtime_sizes.py covers the class)
    inputs = {"x": RESIZE_X, "roi": None, "scales": None, "sizes": np.array([1, 2, 9, 5], np.int64)}
    model = single_node_model("Resize", inputs, opset=13)
    feeds = {"x": RESIZE_X, "sizes": inputs["sizes"]}
    assert_matches(lower_and_run(model, feeds)["y"], run_onnxruntime(model, feeds)["y"], rtol=1e-4, atol=1e-5)


def test_resize_fp16():
    inputs = {"x": RESIZE_X, "roi": None, "scales": np.array([1, 1, 1.7, 0.8], np.float32)}
    model = single_node_model("Resize", inputs, attrs={"mode": "cubic"}, opset=13, initializers=("scales",))
    expected = run_onnxruntime(model, {"x": RESIZE_X})["y"]
    assert_matches(lower_and_run(model, {"x": RESIZE_X}, precision="float16")["y"], expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_align_corners_with_fractional_scale(mode):
    x = rand(1, 1, 4, 4, seed=7)
    scales = np.array([1, 1, 0.6, 0.6], np.float32)
    model = single_node_model("Resize", {"x": x, "roi": None, "scales": scales}, opset=19,
                              attrs={"mode": mode, "coordinate_transformation_mode": "align_corners"},
                              initializers=("scales",))
    check_reference(model, {"x": x, "roi": None, "scales": scales}, initializers=("scales",), rtol=1e-4, atol=1e-5)
