"""DepthToSpace, SpaceToDepth and Pad lowerings against onnxruntime, or onnx's reference
evaluator for the CRD SpaceToDepth it lacks (lowering/ops/space.py).

Each case builds a small ONNX model, lowers it to MIL, runs the program in edgebuild's MIL
interpreter and compares on the same random inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx_cases import check_op, check_reference, rand, single_node_model


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode):
    check_op("DepthToSpace", {"x": rand(2, 8, 3, 4)}, attrs={"blocksize": 2, "mode": mode}, opset=13)


def test_space_to_depth():
    check_op("SpaceToDepth", {"x": rand(2, 3, 6, 4)}, attrs={"blocksize": 2}, opset=13)


PAD_CASES = [
    ("constant", [0, 0, 1, 2, 0, 1, 3, 0], 1.5),
    ("constant", [0, 1, -1, 2, 0, 0, 1, -2], 0.0),
    ("reflect", [0, 0, 2, 1, 0, 0, 1, 3], None),
    ("reflect", [0, 1, 0, 0, 0, 2, 0, 0], None),
    ("edge", [0, 0, 4, 1, 0, 0, 9, 2], None),
    ("edge", [1, 0, 0, 1, 0, 2, 0, 0], None),
    ("wrap", [0, 0, 2, 3, 0, 0, 1, 2], None),
]


@pytest.mark.parametrize("mode,pads,value", PAD_CASES, ids=str)
def test_pad(mode, pads, value):
    inputs = {"x": rand(2, 3, 5, 4), "pads": np.array(pads, np.int64),
              "value": None if value is None else np.float32(value)}
    check_op("Pad", inputs, attrs={"mode": mode}, opset=19, initializers=("pads", "value"))


def test_pad_axes_input_and_old_attribute_form():
    inputs = {"x": rand(2, 3, 5, 4), "pads": np.array([1, 2, 0, 3], np.int64), "value": np.float32(-1),
              "axes": np.array([-1, 1], np.int64)}
    check_op("Pad", inputs, attrs={"mode": "constant"}, opset=18, initializers=("pads", "value", "axes"))
    check_op("Pad", {"x": rand(2, 3, 5, 4)}, attrs={"pads": [0, 0, 1, 1, 0, 0, 2, 0], "value": 2.0}, opset=2)


def test_space_to_depth_crd():
    x = rand(1, 2, 4, 6, seed=6)
    model = single_node_model("SpaceToDepth", {"x": x}, attrs={"blocksize": 2, "mode": "CRD"}, opset=25)
    check_reference(model, {"x": x})
