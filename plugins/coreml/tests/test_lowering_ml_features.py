"""ai.onnx.ml ArrayFeatureExtractor and the statically known Optional ops against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx_cases import I64, IR_VERSION, check, check_op, rand


@pytest.mark.parametrize("shape, indices", [((3, 4), I64(0, 2)), ((2, 3, 5), I64(4, 0, 4)), ((5,), I64(1, 3)),
                                            ((4, 6), np.array([[1, 5]], np.int64))])
def test_array_feature_extractor(shape, indices):
    model = oh.make_model(
        oh.make_graph([oh.make_node("ArrayFeatureExtractor", ["x", "i"], ["y"], domain="ai.onnx.ml")], "g",
                      [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape),
                       oh.make_tensor_value_info("i", onnx.TensorProto.INT64, indices.shape)],
                      [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)]),
        opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid("ai.onnx.ml", 3)], ir_version=IR_VERSION)
    check(model, {"x": rand(*shape), "i": indices})


def test_optional_of_a_tensor_is_present_and_gives_the_tensor():
    x = rand(2, 3)
    check_op("OptionalHasElement", {"x": x})
    check_op("OptionalGetElement", {"x": x})


def test_optional_without_input_is_empty():
    model = oh.make_model(
        oh.make_graph([oh.make_node("OptionalHasElement", [], ["y"]),
                       oh.make_node("Add", ["x", "x"], ["z"])], "g",
                      [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                      [oh.make_tensor_value_info("y", onnx.TensorProto.BOOL, []),
                       oh.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [2])]),
        opset_imports=[oh.make_opsetid("", 18)], ir_version=IR_VERSION)
    check(model, {"x": rand(2)})
