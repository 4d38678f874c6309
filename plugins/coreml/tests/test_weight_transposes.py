"""A weight read transposed (``x @ W.T``, nn.Linear's layout) stays one tensor: the optimise stage
keeps the Transpose, and the lowering reads ``W`` through it as ``linear``'s [out, in] weight."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper
from onnx_cases import IR_VERSION, lower, lower_and_run

from edgebuild.graph.optimize import optimize
from edgebuild.graph.weight_files import load_stage_model


def _linear_read_transposed(path, out_features=256, in_features=128):
    weight = np.random.default_rng(5).standard_normal((out_features, in_features)).astype(np.float32)
    nodes = [helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]), helper.make_node("MatMul", ["x", "Wt"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, in_features])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, out_features])],
                              [numpy_helper.from_array(weight, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path, save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    return model, weight


def test_the_optimiser_keeps_a_weights_transpose_and_the_lowering_reads_through_it(tmp_path):
    _, weight = _linear_read_transposed(tmp_path / "src" / "model.onnx")
    optimize(tmp_path / "src" / "model.onnx", tmp_path / "opt")
    optimised = ir.to_proto(load_stage_model(tmp_path / "opt" / "model.onnx"))  # its data file is a link
    assert [n.op_type for n in optimised.graph.node] == ["Transpose", "Linear"]
    assert [t.name for t in optimised.graph.initializer] == ["W"]  # no transposed second copy

    program = lower(optimised).program
    ops = list(program.functions["main"].operations)
    assert "transpose" not in [op.op_type for op in ops]
    [linear] = [op for op in ops if op.op_type == "linear"]
    np.testing.assert_array_equal(linear.weight.val, weight)  # W itself, [out, in]

    x = np.random.default_rng(6).standard_normal((2, 3, 128)).astype(np.float32)
    expected = x @ weight.T
    np.testing.assert_allclose(lower_and_run(optimised, {"x": x})["y"], expected, rtol=1e-4, atol=1e-4)


def test_a_small_weights_transpose_is_still_folded(tmp_path):
    _linear_read_transposed(tmp_path / "src" / "model.onnx", out_features=16, in_features=8)
    optimize(tmp_path / "src" / "model.onnx", tmp_path / "opt")
    model = ir.load(tmp_path / "opt" / "model.onnx")
    assert "Transpose" not in [n.op_type for n in model.graph]
