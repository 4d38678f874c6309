"""Patterns of decoders exported by torch.onnx with a dynamic sequence dim, lowered with the
dim symbolic and run in the MIL interpreter at several sizes against onnxruntime: the second
half of a rotary split (Slice from a runtime start to INT64_MAX) and a Gather on a bool mask."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
from onnx_cases import IR_VERSION, assert_matches, lower, run_onnxruntime

from edgebuild_coreml.interpreter import run_program

F, I64, BOOL = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64, onnx.TensorProto.BOOL


def _model(nodes, inits, dims=(2, "T", 6)):
    x = oh.make_tensor_value_info("x", F, list(dims))
    graph = oh.make_graph(nodes, "decoder_pattern", [x], [onnx.ValueInfoProto(name="y")], inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=IR_VERSION)


def _check(model):
    result = lower(model)
    for size in (1, 3, 8):
        x = np.random.default_rng(size).standard_normal((2, size, 6)).astype(np.float32)
        produced = run_program(result.program, {result.input_names["x"]: x})[result.output_names["y"]]
        assert_matches(produced, run_onnxruntime(model, {"x": x})["y"], rtol=1e-6, atol=1e-6, name=f"T={size}")


def test_slice_from_a_runtime_start_to_int64_max():
    """x[..., D // 2:] with D read from the shape (rotate_half; symbolic here, as after a runtime
    reshape) and "to the end" as INT64_MAX."""
    model = _model([
        oh.make_node("Shape", ["x"], ["s"]), oh.make_node("Gather", ["s", "last"], ["d"], axis=0),
        oh.make_node("Div", ["d", "two"], ["half"]), oh.make_node("Unsqueeze", ["half", "axis0"], ["start"]),
        oh.make_node("Slice", ["x", "start", "end", "axes"], ["y"])],
        [oh.make_tensor("last", I64, [], [2]), oh.make_tensor("two", I64, [], [2]),
         oh.make_tensor("axis0", I64, [1], [0]), oh.make_tensor("end", I64, [1], [np.iinfo(np.int64).max]),
         oh.make_tensor("axes", I64, [1], [2])], dims=(2, "T", "D"))
    _check(model)


def test_gather_on_a_bool_mask():
    """A causal-mask style bool tensor indexed with Gather (MIL's gather takes no bool data)."""
    model = _model([
        oh.make_node("Less", ["x", "zero"], ["mask"]), oh.make_node("Gather", ["mask", "rows"], ["picked"], axis=1),
        oh.make_node("Cast", ["picked"], ["y"], to=F)],
        [oh.make_tensor("zero", F, [], [0.0]), oh.make_tensor("rows", I64, [2], [0, -1])])
    _check(model)
