"""If outputs that the two branches give in different shapes end in one shape.

Each graph takes both branches (x's sign decides) and runs in onnx's reference evaluator before
and after the pass: the same values, and after it both branches give the output one shape. The
forms: a scalar against ``[1]``, ``[1, N]`` against ``[N]``, a constant branch, a ``[1]`` its readers
broadcast against ``[N]``, the If in a Loop body as the stop condition (Paddle2ONNX's decoders), the
shape the graph declares for the output winning over the higher rank. What ONNX semantics do not
allow to join is left as it is.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper as oh, numpy_helper as onh
from onnx.reference import ReferenceEvaluator

from edgebuild.graph.if_branches import PASS, branch_shape_mismatches

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _vi(name, dtype, shape):
    return oh.make_tensor_value_info(name, dtype, shape)


def _branch(name, nodes, out, shape, inits=(), dtype=F):
    return oh.make_graph(nodes, name, [], [_vi(out, dtype, shape)], list(inits))


def _reduce(op, out, keepdims, axes=None):
    inputs = ["x"] if axes is None else ["x", f"{out}_axes"]
    inits = [] if axes is None else [onh.from_array(np.array(axes, np.int64), f"{out}_axes")]
    return [oh.make_node(op, inputs, [out], keepdims=keepdims)], inits


def _if_model(then, els, reader="Mul", declared=None) -> onnx.ModelProto:
    nodes = [oh.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             oh.make_node("Greater", ["total", "zero"], ["positive"]),
             oh.make_node("If", ["positive"], ["z"], then_branch=then, else_branch=els),
             oh.make_node(reader, ["x", "z"], ["y"])]
    value_info = [] if declared is None else [_vi("z", F, declared)]
    graph = oh.make_graph(nodes, "g", [_vi("x", F, [2, 3])], [onnx.ValueInfoProto(name="y")],
                          [onh.from_array(np.array(0.0, np.float32), "zero")], value_info=value_info)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)


def _run_pass(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int, ir.Model]:
    graph = ir.serde.deserialize_model(model)
    count = PASS.apply(graph)
    return ir.serde.serialize_model(graph), count, graph


def _both_signs():
    x = np.abs(np.random.default_rng(0).uniform(0.5, 2.0, (2, 3))).astype(np.float32)
    return [{"x": x}, {"x": -x}]


def _check_same_values(source, rewritten):
    for feeds in _both_signs():
        expected = ReferenceEvaluator(source).run(None, feeds)
        produced = ReferenceEvaluator(rewritten).run(None, feeds)
        for want, got in zip(expected, produced):
            np.testing.assert_allclose(got, want, rtol=1e-6)


def _the_if(model: ir.Model) -> ir.Node:
    return next(node for node in model.graph if node.op_type == "If")


def _branch_shapes(node: ir.Node, index=0):
    return [list(node.attributes[b].value.outputs[index].shape) for b in ("then_branch", "else_branch")]


def _cases():
    then_sum, then_sum_inits = _reduce("ReduceSum", "a", 0)
    max_nodes, max_inits = _reduce("ReduceMax", "b0", 0)
    scalar_vs_1 = (_branch("then", then_sum, "a", [], then_sum_inits),
                   _branch("else", max_nodes + [oh.make_node("Reshape", ["b0", "one"], ["b"])], "b", [1],
                           max_inits + [onh.from_array(np.array([1], np.int64), "one")]))
    rows_then, rows_then_inits = _reduce("ReduceSum", "a", 1, axes=[0])
    rows_else, rows_else_inits = _reduce("ReduceMax", "b", 0, axes=[0])
    row_vs_vector = (_branch("then", rows_then, "a", [1, 3], rows_then_inits),
                     _branch("else", rows_else, "b", [3], rows_else_inits))
    mean_nodes, mean_inits = _reduce("ReduceMean", "b", 0)
    constant = (_branch("then", [oh.make_node("Constant", [], ["a"], value=onh.from_array(np.array([2.5], np.float32)))],
                        "a", [1]), _branch("else", mean_nodes, "b", [], mean_inits))
    fill = (_branch("then", [oh.make_node("Constant", [], ["a"], value=onh.from_array(np.array([0.5], np.float32)))], "a", [1]),
            _branch("else", rows_else, "b", [3], rows_else_inits))
    return {"scalar_vs_1": scalar_vs_1, "1N_vs_N": row_vs_vector, "constant_branch": constant,
            "broadcast_1_vs_N": fill}


@pytest.mark.parametrize("name", ["scalar_vs_1", "1N_vs_N", "constant_branch", "broadcast_1_vs_N"])
@pytest.mark.parametrize("typed", [True, False], ids=["branches-typed", "branches-untyped"])
def test_branches_end_in_one_shape(name, typed):
    then, els = _cases()[name]
    source = _if_model(then, els)
    if not typed:  # what an exporter writes without value_info: the pass needs the shapes inferred
        for branch in (then, els):
            branch.output[0].type.tensor_type.ClearField("shape")
        source = onnx.shape_inference.infer_shapes(source)
    rewritten, count, graph = _run_pass(source)
    assert count == 1
    first, second = _branch_shapes(_the_if(graph))
    assert first == second
    _check_same_values(source, rewritten)


def test_the_declared_shape_wins_over_the_higher_rank():
    """A Flatten reads the output typed [3]: the [1, 3] branch is squeezed, not the [3] one unsqueezed."""
    then, els = _cases()["1N_vs_N"]
    source = _if_model(then, els, reader="Add", declared=[3])
    rewritten, count, graph = _run_pass(source)
    assert count == 1 and _branch_shapes(_the_if(graph)) == [[3], [3]]
    _check_same_values(source, rewritten)


def test_stop_condition_of_a_loop_body():
    """Paddle2ONNX's decoders: the Loop's condition is an If giving [1] (a constant) or a scalar comparison."""
    then = _branch("then", [oh.make_node("Constant", [], ["stop"], value=onh.from_array(np.array([False])))], "stop",
                   [1], dtype=B)
    els = _branch("else", [oh.make_node("Less", ["acc_sum", "limit"], ["go_on"])], "go_on", [], dtype=B)
    body = oh.make_graph([
        oh.make_node("Mul", ["acc", "two"], ["acc_next"]),
        oh.make_node("ReduceSum", ["acc_next"], ["acc_sum"], keepdims=0),
        oh.make_node("Greater", ["acc_sum", "big"], ["overflow"]),
        oh.make_node("If", ["overflow"], ["cond_out"], then_branch=then, else_branch=els),
    ], "body", [_vi("i", I64, []), _vi("cond_in", B, []), _vi("acc", F, [2, 3])],
        [_vi("cond_out", B, None), _vi("acc_next", F, [2, 3])],
        [onh.from_array(np.array(2.0, np.float32), "two"), onh.from_array(np.array(1000.0, np.float32), "big"),
         onh.from_array(np.array(100.0, np.float32), "limit")])
    graph = oh.make_graph([oh.make_node("Abs", ["x"], ["start"]),
                           oh.make_node("Loop", ["trips", "go", "start"], ["y"], body=body)],
                          "g", [_vi("x", F, [2, 3])], [onnx.ValueInfoProto(name="y")],
                          [onh.from_array(np.array(20, np.int64), "trips"), onh.from_array(np.array(True), "go")])
    source = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)
    rewritten, count, model = _run_pass(source)
    assert count == 1
    loop = next(node for node in model.graph if node.op_type == "Loop")
    inner_if = next(node for node in loop.attributes["body"].value if node.op_type == "If")
    first, second = _branch_shapes(inner_if)
    assert first == second
    for scale in (1.0, 40.0):  # stops by the comparison; stops by the constant branch after an overflow
        feeds = {"x": np.full((2, 3), scale, np.float32)}
        np.testing.assert_allclose(ReferenceEvaluator(rewritten).run(None, feeds)[0],
                                   ReferenceEvaluator(source).run(None, feeds)[0], rtol=1e-6)


def test_shapes_semantics_do_not_join_are_left_and_named():
    """[2, 3] against [3, 2] hold the same elements but no reshape keeps every reader's view."""
    then = _branch("then", [oh.make_node("Identity", ["x"], ["a"])], "a", [2, 3])
    els = _branch("else", [oh.make_node("Transpose", ["x"], ["b"], perm=[1, 0])], "b", [3, 2])
    source = _if_model(then, els, reader="Mul")
    _, count, graph = _run_pass(source)
    assert count == 0
    assert branch_shape_mismatches(_the_if(graph)) == ["output 0 is [2, 3] in then_branch and [3, 2] in else_branch"]


def test_a_1_a_reader_would_not_broadcast_is_left():
    """[1] against [3] read by a ReduceSum: expanding the [1] would change its sum."""
    then, els = _cases()["broadcast_1_vs_N"]
    nodes = [oh.make_node("ReduceSum", ["x"], ["total"], keepdims=0), oh.make_node("Greater", ["total", "zero"], ["p"]),
             oh.make_node("If", ["p"], ["z"], then_branch=then, else_branch=els),
             oh.make_node("ReduceSum", ["z"], ["y"], keepdims=0)]
    graph = oh.make_graph(nodes, "g", [_vi("x", F, [2, 3])], [onnx.ValueInfoProto(name="y")],
                          [onh.from_array(np.array(0.0, np.float32), "zero")])
    source = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)
    _, count, _ = _run_pass(source)
    assert count == 0


def test_an_output_read_as_a_shape_is_left():
    """[N] against [1, N] read as a Reshape's target: a [1, N] target would be no shape at all."""
    then = _branch("then", [oh.make_node("Constant", [], ["a"], value=onh.from_array(np.array([[3, 2]], np.int64)))],
                   "a", [1, 2], dtype=I64)
    els = _branch("else", [oh.make_node("Constant", [], ["b"], value=onh.from_array(np.array([2, 3], np.int64)))],
                  "b", [2], dtype=I64)
    nodes = [oh.make_node("ReduceSum", ["x"], ["total"], keepdims=0), oh.make_node("Greater", ["total", "zero"], ["p"]),
             oh.make_node("If", ["p"], ["target"], then_branch=then, else_branch=els),
             oh.make_node("Reshape", ["x", "target"], ["y"])]
    graph = oh.make_graph(nodes, "g", [_vi("x", F, [2, 3])], [onnx.ValueInfoProto(name="y")],
                          [onh.from_array(np.array(0.0, np.float32), "zero")])
    _, count, _ = _run_pass(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10))
    assert count == 0
