"""The tiny project the core's tests build: a three-node ONNX model and a recipe for it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# the recipe the ``project`` fixture writes beside tiny.onnx; {extra} takes more sections
RECIPE = """\
edgebuild: 1
name: tiny
source:
  model: tiny.onnx
  inputs: {{x: {{shape: [2, 4], dtype: float32}}}}
target: {{backend: testcopy, precision: float32}}
{extra}
outputs: {{dir: out}}
"""


def tiny_model(path: Path, scale: float = 2.0) -> Path:
    """y = relu(x * w + b): enough graph for import and optimise to do real work."""
    w = numpy_helper.from_array(np.full((4,), scale, dtype=np.float32), "w")
    b = numpy_helper.from_array(np.arange(4, dtype=np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"])],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return path
