"""Calls and control flow: ``func.call`` (inlined), ``composite`` (its decomposition inlined),
``custom_call`` (refused with its target; jax's ``shape_assertion`` is a no-op, its
``stablehlo.dynamic_reduce_window`` a windowed reduction), ``while`` (an
ONNX Loop), ``case`` and ``if`` (nested ONNX Ifs), ``optimization_barrier`` (its operands)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from edgebuild_jax.convert.dynamic_windows import dynamic_reduce_window
from edgebuild_jax.convert.registry import converts


def _symbol(attr) -> str:
    return str(attr).lstrip("@").strip('"')


def inline_function(cx, name: str, arguments, op):
    function = cx.functions.get(name)
    if function is None:
        raise cx.error(op, f"calls {name}, which the module does not define")
    return cx.convert_block(function.regions[0].blocks[0], arguments)


@converts("func.call")
def call(op, cx):
    return inline_function(cx, _symbol(op.attributes["callee"]), cx.inputs(op), op)


@converts("stablehlo.composite")
def composite(op, cx):
    return inline_function(cx, _symbol(op.attributes["decomposition"]), cx.inputs(op), op)


@converts("stablehlo.custom_call")
def custom_call(op, cx):
    target = str(op.attributes["call_target_name"]).strip('"')
    if target == "shape_assertion":  # jax's check of symbolic dims at run time: it computes nothing
        return []
    if target == "stablehlo.dynamic_reduce_window":  # a reduce_window whose padding or size is symbolic
        return dynamic_reduce_window(op, cx)
    raise cx.error(op, f"custom_call to {target!r} is not supported: its semantics live in a runtime library",
                   hint="export without the custom kernel (e.g. jax's default lowering on CPU), or register "
                        "a plugin lowering for it")


# -- loops and branches ----------------------------------------------------------------------


def _typed_input(cx, mlir_value, hint: str) -> ir.Value:
    """A subgraph input carrying ``mlir_value``'s element type and shape (ONNX requires both)."""
    return ir.Value(name=cx.fresh_name(hint), type=ir.TensorType(cx.dtype(mlir_value)),
                    shape=ir.Shape(cx.shape(mlir_value)))


def _typed(cx, values, mlir_values):
    """The outputs of the subgraph being written, typed as the MLIR values (subgraph outputs need
    types); a value from outside it (an enclosing graph's, a passed-through input) goes through a
    typed Identity, as ONNX wants every output produced inside its graph."""
    outputs = []
    for onnx_value, mlir_value in zip(values, mlir_values):
        producer = onnx_value.producer()
        if producer is None or producer.graph is not cx.scope.graph:
            onnx_value = cx.node("Identity", [onnx_value])
        cx.annotate(onnx_value, mlir_value)
        outputs.append(onnx_value)
    return outputs


def _as_condition(cx, value: ir.Value) -> ir.Value:
    """A Loop condition is a bool scalar; the cond region returns a tensor<i1> of rank 0."""
    if value.shape is not None and len(value.shape) != 0:
        value = cx.node("Reshape", [value, cx.ints([])])
    return value


@converts("stablehlo.while")
def while_loop(op, cx):
    """An ONNX Loop. A counted loop (a counter compared LT a constant) gets its trip count and no
    condition; any other gets the cond region converted once before the loop for the first
    condition and inside the body, on the values the iteration produced, for the next."""
    cond_block = op.regions[0].blocks[0]
    body_block = op.regions[1].blocks[0]
    initial = cx.inputs(op)
    trip_count = _trip_count(op, cx, initial)
    first_condition = None
    if trip_count is None:
        first_condition = _as_condition(cx, cx.convert_block(cond_block, initial)[0])

    iteration = ir.Value(name=cx.fresh_name("iteration"), type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([]))
    condition_in = ir.Value(name=cx.fresh_name("condition_in"), type=ir.TensorType(ir.DataType.BOOL),
                            shape=ir.Shape([]))
    carried = [_typed_input(cx, arg, "carried") for arg in body_block.arguments]

    def body():
        updated = cx.convert_block(body_block, carried)
        if trip_count is not None:
            condition = condition_in  # the trip count ends the loop
        else:  # the next iteration's condition, on the values this iteration produced
            condition = _as_condition(cx, cx.convert_block(cond_block, updated)[0])
            condition.type = condition.type or ir.TensorType(ir.DataType.BOOL)
        return [condition, *_typed(cx, updated, op.results)]

    graph = cx.subgraph("while_body", body, [iteration, condition_in, *carried])
    outputs = cx.node("Loop", [trip_count, first_condition, *initial], {"body": graph}, outputs=len(op.results))
    return [outputs] if len(op.results) == 1 else list(outputs)


def _trip_count(op, cx, initial):
    """The trip count of a counted loop (``fori_loop`` and ``scan`` compare a counter that starts at a
    constant and steps by one LT a constant bound), else None (the condition alone ends the loop)."""
    cond_block = op.regions[0].blocks[0]
    ops = list(cond_block.operations)
    if len(ops) < 2 or ops[-1].operation.name != "stablehlo.return":
        return None
    compare = ops[-2]
    if compare.operation.name != "stablehlo.compare" or "LT" not in str(compare.attributes["comparison_direction"]):
        return None
    if ops[-1].operands[0] != compare.result:
        return None
    counter, bound = compare.operands
    positions = [i for i, arg in enumerate(cond_block.arguments) if arg == counter]
    bound_op = bound.owner
    if not positions or getattr(bound_op, "name", None) != "stablehlo.constant":
        return None
    start = cx.folded(initial[positions[0]])
    limit = np.asarray(bound_op.attributes["value"])
    if start is None or start.size != 1 or limit.size != 1 or start.dtype.kind not in "iu":
        return None  # a float counter's trip count is not limit - start
    if not _steps_by_one(op, positions[0]):
        return None
    return cx.const(np.asarray(max(int(limit.reshape(-1)[0]) - int(start.reshape(-1)[0]), 0), dtype=np.int64),
                    name="trip_count")


def _steps_by_one(op, position: int) -> bool:
    """Whether the body returns its ``position``-th argument plus the constant 1."""
    body_block = op.regions[1].blocks[0]
    terminator = list(body_block.operations)[-1]
    step = terminator.operands[position].owner
    if getattr(step, "name", None) != "stablehlo.add":
        return False
    left, right = step.operands
    for this, other in ((left, right), (right, left)):
        constant = getattr(other.owner, "name", None) == "stablehlo.constant"
        if this == body_block.arguments[position] and constant:
            value = np.asarray(other.owner.attributes["value"])
            return value.size == 1 and int(value.reshape(-1)[0]) == 1
    return False


def _branch(cx, op, region, name: str) -> ir.Graph:
    return cx.subgraph(name, lambda: _typed(cx, cx.convert_block(region.blocks[0], []), op.results))


def _if(cx, op, condition: ir.Value, then_graph: ir.Graph, else_graph: ir.Graph):
    outputs = cx.node("If", [condition], {"then_branch": then_graph, "else_branch": else_graph},
                      outputs=len(op.results))
    return [outputs] if len(op.results) == 1 else list(outputs)


@converts("stablehlo.if")
def if_op(op, cx):
    condition = _as_condition(cx, cx.inputs(op)[0])
    return _if(cx, op, condition, _branch(cx, op, op.regions[0], "then"), _branch(cx, op, op.regions[1], "else"))


@converts("stablehlo.case")
def case(op, cx):
    """Branch k runs when the index is k; an index out of range runs the last branch (the spec's
    clamp), which the chain of Equal tests gives: every test fails, the last else runs."""
    index = cx.inputs(op)[0]
    index_type = cx.np_dtype(op.operands[0])
    branches = list(op.regions)

    def chain(k: int):
        if k == len(branches) - 1:
            return _typed(cx, cx.convert_block(branches[k].blocks[0], []), op.results)
        condition = _as_condition(cx, cx.node("Equal", [index, cx.const(np.asarray(k, dtype=index_type))]))
        rest = cx.subgraph(f"case_{k + 1}", lambda: chain(k + 1))
        return _typed(cx, _if(cx, op, condition, _branch(cx, op, branches[k], f"case_{k}"), rest), op.results)

    return chain(0)


@converts("stablehlo.optimization_barrier")
def optimization_barrier(op, cx):
    """Only a scheduling hint for XLA: its results are its operands."""
    return [cx.node("Identity", [v]) for v in cx.inputs(op)]
