"""The optimise stage saves a valid model when onnxscript's rules add two constants of one name.

onnxscript's ReshapeReshape names its new shape ``<output>/shape`` and Flatten2Reshape names its
``<input>/shape``: for ``y = Reshape(Reshape(x))`` read by a Flatten, both are ``y/shape``, and the
graph's initializer table keeps the second while the first Reshape still reads the first
(torchvision's Faster R-CNN RPN has this chain). Without the repair the saved model has an input
nothing produces.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from edgebuild.graph.optimize import optimize


def test_reshape_chain_read_by_a_flatten_keeps_both_shapes(tmp_path):
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["r1"]), helper.make_node("Reshape", ["r1", "s2"], ["y"]),
             helper.make_node("Flatten", ["y"], ["z"], axis=1), helper.make_node("Relu", ["y"], ["w"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([6, 4], np.int64), "s1"),
         numpy_helper.from_array(np.array([4, 3, 2], np.int64), "s2")])
    source = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    source.ir_version = 8
    onnx.save(source, tmp_path / "in.onnx")

    optimize(tmp_path / "in.onnx", tmp_path / "out")

    optimized = onnx.load(str(tmp_path / "out" / "model.onnx"))
    onnx.checker.check_model(optimized, full_check=True)
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 10
    expected = ReferenceEvaluator(source).run(None, {"x": x})
    produced = ReferenceEvaluator(optimized).run(None, {"x": x})
    for want, got in zip(expected, produced):
        np.testing.assert_array_equal(got, want)
