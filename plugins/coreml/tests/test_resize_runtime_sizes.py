"""Resize whose output sizes or scales are known only at run time (Keypoint and Mask R-CNN paste each
heatmap or mask into its own box inside a Loop; lowering/ops/_resize_runtime.py).

The sizes (or scales) are computed in the graph from an input, so the sampling grid is built in the
graph. Each case runs in the MIL interpreter against onnxruntime at several sizes, over every
mode, nearest_mode and coordinate mode built at run time, ranks 3-5 and the ``axes`` attribute, and
inside a Loop body; the forms not built at run time are declined by name.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest
from onnx_cases import IR_VERSION, assert_matches, lower, lower_and_run, rand, run_onnxruntime

from edgebuild.errors import BuildError

RTOL, ATOL = 1e-4, 2e-5
COORDINATES = ("half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel", "half_pixel_symmetric")
NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
# (output lengths of the two resized axes): up, down, mixed, odd ratios, one pixel
SIZES = ((7, 9), (2, 3), (5, 1), (11, 4), (1, 1), (3, 5))
# scales of the two resized axes, fractional lengths included
SCALES = ((2.0, 1.5), (0.5, 0.7), (1.7, 3.0), (0.34, 1.25))
IN = (3, 5)  # lengths of the resized axes


def _model(nodes, inputs, initializers, opset: int = 19) -> onnx.ModelProto:
    graph = oh.make_graph(nodes, "case", inputs, [onnx.ValueInfoProto(name="y")], initializers)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], ir_version=IR_VERSION)
    return onnx.shape_inference.infer_shapes(model)


def sized_model(rank: int, attrs: dict, *, axes=None) -> onnx.ModelProto:
    """y = Resize(x, sizes = lead ++ (hw + 0)): the sizes come from the input ``hw`` at run time."""
    lead = rank - 2
    shape = [2] * lead + list(IN)
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)
    hw = oh.make_tensor_value_info("hw", onnx.TensorProto.INT64, [2])
    zero = onh.from_array(np.zeros(2, dtype=np.int64), "zero")
    inits = [zero]
    if axes is None:
        inits.append(onh.from_array(np.asarray(shape[:lead], dtype=np.int64), "lead"))
        nodes = [oh.make_node("Add", ["hw", "zero"], ["sized"]), oh.make_node("Concat", ["lead", "sized"], ["sizes"], axis=0)]
    else:
        nodes = [oh.make_node("Add", ["hw", "zero"], ["sizes"])]
    nodes.append(oh.make_node("Resize", ["x", "", "", "sizes"], ["y"], **attrs, **({} if axes is None else {"axes": axes})))
    return _model(nodes, [x, hw], inits)


def scaled_model(rank: int, attrs: dict) -> onnx.ModelProto:
    """y = Resize(x, scales = ones ++ s): the scales are an input."""
    lead = rank - 2
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2] * lead + list(IN))
    s = oh.make_tensor_value_info("s", onnx.TensorProto.FLOAT, [2])
    ones = onh.from_array(np.ones(lead, dtype=np.float32), "ones")
    nodes = [oh.make_node("Concat", ["ones", "s"], ["scales"], axis=0),
             oh.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)]
    return _model(nodes, [x, s], [ones])


def _spec(model, feeds):
    """The ONNX spec's answer (onnx's reference evaluator), where onnxruntime has no kernel or
    divides by another length."""
    from onnx.reference import ReferenceEvaluator

    return {"y": ReferenceEvaluator(model).run(None, feeds)[0].astype(np.float32)}


def _compare(model, feeds, reference=run_onnxruntime):
    expected = reference(model, feeds)["y"]
    actual = lower_and_run(model, feeds)["y"]
    assert actual.shape == expected.shape
    assert_matches(actual, expected, rtol=RTOL, atol=ATOL)


def _size_feeds(rank):
    lead = rank - 2
    return [{"x": rand(*([2] * lead), *IN, seed=i), "hw": np.asarray(hw, dtype=np.int64)} for i, hw in enumerate(SIZES)]


@pytest.mark.parametrize("coordinates", COORDINATES)
@pytest.mark.parametrize("mode", ("linear", "nearest", "cubic"))
def test_sizes_from_an_input(mode, coordinates):
    model = sized_model(4, {"mode": mode, "coordinate_transformation_mode": coordinates})
    for feeds in _size_feeds(4):
        _compare(model, feeds)


@pytest.mark.parametrize("nearest_mode", NEAREST)
@pytest.mark.parametrize("coordinates", COORDINATES)
def test_every_nearest_mode(coordinates, nearest_mode):
    if coordinates == "half_pixel_symmetric" and nearest_mode in ("floor", "ceil"):
        pytest.skip("onnxruntime divides in float64 here; a float32 grid can land one ulp off an integer")
    model = sized_model(4, {"mode": "nearest", "coordinate_transformation_mode": coordinates,
                            "nearest_mode": nearest_mode})
    for feeds in _size_feeds(4):
        _compare(model, feeds)


@pytest.mark.parametrize("coordinates", COORDINATES)
@pytest.mark.parametrize("mode", ("linear", "nearest", "cubic"))
def test_scales_from_an_input(mode, coordinates):
    if coordinates == "align_corners":
        pytest.skip("onnxruntime divides by the floored length here; tested against the spec below")
    model = scaled_model(4, {"mode": mode, "coordinate_transformation_mode": coordinates})
    for i, s in enumerate(SCALES):
        _compare(model, {"x": rand(2, 2, *IN, seed=i), "s": np.asarray(s, dtype=np.float32)})


@pytest.mark.parametrize("rank", (3, 4, 5))
@pytest.mark.parametrize("mode", ("linear", "nearest", "cubic"))
def test_ranks(rank, mode):
    model = sized_model(rank, {"mode": mode, "coordinate_transformation_mode": "half_pixel"})
    # onnxruntime's cubic kernel takes 2-D and 4-D inputs only
    reference = _spec if mode == "cubic" and rank != 4 else run_onnxruntime
    for feeds in _size_feeds(rank):
        _compare(model, feeds, reference)


@pytest.mark.parametrize("axes", ([2, 3], [-1, -2], [3, 1]))
def test_axes_attribute(axes):
    model = sized_model(4, {"mode": "linear", "coordinate_transformation_mode": "half_pixel"}, axes=axes)
    x = rand(2, 3, *IN, seed=4)
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 3
    # onnxruntime's linear kernel resizes the innermost axes of a 4-D input only
    reference = _spec if axes == [3, 1] else run_onnxruntime
    for hw in SIZES:
        _compare(model, {"x": x, "hw": np.asarray(hw, dtype=np.int64)}, reference)


def test_cubic_exclude_outside_and_coefficient():
    model = sized_model(4, {"mode": "cubic", "coordinate_transformation_mode": "half_pixel",
                            "exclude_outside": 1, "cubic_coeff_a": -0.5})
    for feeds in _size_feeds(4):
        _compare(model, feeds)


def loop_model(mode: str, coordinates: str, trips: int = 4) -> onnx.ModelProto:
    """As a detector's paste step: iteration i resizes x to (2 + i, 3 + 2 i), then sums it (the
    scan output has one shape across iterations)."""
    f32, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    body_nodes = [
        oh.make_node("Constant", [], ["base"], value=onh.from_array(np.array([2, 3], dtype=np.int64))),
        oh.make_node("Constant", [], ["step"], value=onh.from_array(np.array([1, 2], dtype=np.int64))),
        oh.make_node("Constant", [], ["lead"], value=onh.from_array(np.array([1, 2], dtype=np.int64))),
        oh.make_node("Mul", ["i", "step"], ["grow"]),
        oh.make_node("Add", ["base", "grow"], ["hw"]),
        oh.make_node("Concat", ["lead", "hw"], ["sizes"], axis=0),
        oh.make_node("Resize", ["x", "", "", "sizes"], ["pasted"], mode=mode, coordinate_transformation_mode=coordinates),
        oh.make_node("ReduceSum", ["pasted"], ["total"], keepdims=0),
        oh.make_node("Identity", ["cond_in"], ["cond_out"]),
    ]
    body = oh.make_graph(
        body_nodes, "paste",
        [oh.make_tensor_value_info("i", i64, []), oh.make_tensor_value_info("cond_in", onnx.TensorProto.BOOL, [])],
        [oh.make_tensor_value_info("cond_out", onnx.TensorProto.BOOL, []), oh.make_tensor_value_info("total", f32, [])],
    )
    nodes = [oh.make_node("Loop", ["trips", ""], ["y"], body=body)]
    x = oh.make_tensor_value_info("x", f32, [1, 2, *IN])
    return _model(nodes, [x], [onh.from_array(np.array(trips, dtype=np.int64), "trips")])


@pytest.mark.parametrize("mode,coordinates", [("linear", "half_pixel"), ("cubic", "half_pixel"),
                                              ("nearest", "asymmetric"), ("linear", "align_corners")])
def test_inside_a_loop_body(mode, coordinates):
    model = loop_model(mode, coordinates)
    _compare(model, {"x": rand(1, 2, *IN, seed=9)})


@pytest.mark.parametrize("mode", ("linear", "nearest", "cubic"))
def test_align_corners_scales_follow_the_spec(mode):
    """With run-time scales, align_corners divides by length_resized = scale * length, unfloored,
    as the spec and onnx's reference evaluator do."""
    model = scaled_model(4, {"mode": mode, "coordinate_transformation_mode": "align_corners"})
    for i, s in enumerate(SCALES):
        _compare(model, {"x": rand(2, 2, *IN, seed=i), "s": np.asarray(s, dtype=np.float32)}, _spec)


def _declined(model, match):
    with pytest.raises(BuildError, match=match):
        lower(model)


def test_antialias_declined_by_name():
    _declined(sized_model(4, {"mode": "linear", "antialias": 1}), "antialias")


def test_crop_and_resize_declined_by_name():
    _declined(sized_model(4, {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"}),
              "tf_crop_and_resize")


def test_aspect_ratio_policy_declined_by_name():
    _declined(sized_model(4, {"mode": "linear", "keep_aspect_ratio_policy": "not_larger"}, axes=[2, 3]),
              "keep_aspect_ratio_policy")


@pytest.mark.parametrize("operand", ("scales", "sizes"))
@pytest.mark.parametrize("mode", ("linear", "nearest", "cubic"))
def test_constant_operand_on_run_time_lengths(mode, operand):
    """Constant scales or sizes, but the resized lengths themselves known only at run time."""
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, "h", "w"])
    value = (np.array([1, 1, 2.0, 1.5], dtype=np.float32) if operand == "scales"
             else np.array([1, 2, 6, 4], dtype=np.int64))
    inputs = ["x", "", "c", ""] if operand == "scales" else ["x", "", "", "c"]
    node = oh.make_node("Resize", inputs, ["y"], mode=mode, coordinate_transformation_mode="half_pixel")
    model = _model([node], [x], [onh.from_array(value, "c")])
    for h, w in ((3, 5), (4, 2), (1, 6)):
        _compare(model, {"x": rand(1, 2, h, w, seed=h)})
