"""If nodes whose branches give an output two shapes: each branch ends in the one shape.

ONNX lets an ``If``'s branches produce an output in different shapes, and onnxruntime runs
them: Paddle2ONNX's decoders compute a Loop's stop condition as a scalar in one branch and as a
``[1]`` tensor in the other, and exporters mix ``[1, N]`` with ``[N]``. Backends whose conditional
needs one type per output (MIL's ``cond``) cannot take that. Where the two shapes hold the same
elements up to leading 1s (``[]`` / ``[1]``, ``[N]`` / ``[1, N]``), or one is broadcast to the other
by every reader anyway, the branch with the other shape gets an Unsqueeze, Reshape or Expand at its
end, so the output has one shape and its readers see it whichever branch ran.

The shape both branches take is the one the graph declares for the output when it is one of
the two (its readers were typed for it); else the higher rank, when every reader broadcasts
(elementwise ops, Reshape, a condition, a graph output), which makes the leading 1s no change.
A pair that fits neither rule is left as it is and the backend's lowering names it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from edgebuild.graph.external_data import iter_graphs

# readers for which x of shape [d...] and [1, d...] give the same values (broadcasting, or by element)
_BROADCASTING = {
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Min", "Max", "Sum", "Mean", "Equal", "Less", "Greater",
    "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Where", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
    "Reshape", "Expand",
}
# readers that pass their input's shape on: their own readers decide
_SHAPE_PASSING = {
    "Cast", "Identity", "Not", "Neg", "Abs", "Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Reciprocal",
    "Floor", "Ceil", "Round", "Sign", "Erf", "Clip", "IsNaN", "IsInf",
}


def _dims(shape: ir.Shape) -> list:
    return [d if isinstance(d, int) else (d.value or object()) for d in shape]  # unnamed dims equal nothing


def _same(a: ir.Shape, b: ir.Shape) -> bool:
    return len(a) == len(b) and all(x == y for x, y in zip(_dims(a), _dims(b)))


def _padded(shape: ir.Shape, rank: int) -> list:
    return [1] * (rank - len(shape)) + _dims(shape)


def _leading_ones_apart(low: ir.Shape, high: ir.Shape) -> bool:
    """``high`` is ``low`` with 1s in front."""
    return len(low) < len(high) and _padded(low, len(high)) == _dims(high)


def _broadcast_target(a: ir.Shape, b: ir.Shape) -> list | None:
    """The static shape both broadcast to when every differing dim is a 1 against a static size."""
    rank = max(len(a), len(b))
    target = []
    for x, y in zip(_padded(a, rank), _padded(b, rank)):
        if x == y:
            target.append(x)
        elif x == 1 and isinstance(y, int):
            target.append(y)
        elif y == 1 and isinstance(x, int):
            target.append(x)
        else:
            return None
    return target if all(isinstance(d, int) for d in target) else None


def _reads_broadcasting(value: ir.Value, expand_to: list | None = None) -> bool:
    """Every reader of ``value`` takes ``[d...]`` and ``[1, d...]`` alike; with ``expand_to``, also a
    1 against the size there (an elementwise reader whose other operands already have that size)."""
    if value.is_graph_output() and expand_to is not None:
        return False  # a graph output (a Loop body's condition included) may take the leading 1s, not more
    for use in value.uses():
        reader = use.node
        if reader.domain not in ("", "ai.onnx"):
            return False
        if (reader.op_type, use.idx) in (("If", 0), ("Loop", 1)):
            if expand_to is not None:
                return False
            continue  # a condition: one element either way
        if reader.op_type in _SHAPE_PASSING:
            if expand_to is not None or not all(_reads_broadcasting(out) for out in reader.outputs):
                return False
            continue
        if reader.op_type not in _BROADCASTING or (reader.op_type in ("Reshape", "Expand") and use.idx != 0):
            return False  # a Reshape's or Expand's shape operand must stay 1-D
        if expand_to is not None:
            if reader.op_type in ("Reshape", "Expand"):
                return False
            others = [v for i, v in enumerate(reader.inputs) if i != use.idx and v is not None]
            if not any(v.shape is not None and _covers(v.shape, expand_to) for v in others):
                return False
    return True


def _covers(shape: ir.Shape, target: list) -> bool:
    """``shape`` broadcast against ``target`` gives ``target``'s sizes where ``target`` is not 1."""
    dims = _dims(shape)
    if len(dims) < len(target):
        dims = [1] * (len(target) - len(dims)) + dims
    return all(t == 1 or d == t for d, t in zip(dims[-len(target):], target))


def _constant(graph: ir.Graph, array: np.ndarray, name: str) -> ir.Value:
    node = ir.node("Constant", [], attributes={"value": ir.tensor(array, name=name)}, name=name)
    node.outputs[0].name = name
    node.outputs[0].shape = ir.Shape(array.shape)
    node.outputs[0].dtype = ir.DataType.from_numpy(array.dtype)
    graph.append(node)
    return node.outputs[0]


def _end_branch_in(graph: ir.Graph, index: int, target: list, how: str) -> None:
    """Give output ``index`` of ``graph`` the shape ``target`` with an op appended to the branch."""
    value = graph.outputs[index]
    rank_gap = len(target) - len(value.shape)
    base = f"{value.name}_unified"
    if how == "unsqueeze":
        axes = _constant(graph, np.arange(rank_gap, dtype=np.int64), f"{base}_axes")
        node = ir.node("Unsqueeze", [value, axes], name=base)
    elif how == "squeeze":
        axes = _constant(graph, np.arange(-rank_gap, dtype=np.int64), f"{base}_axes")
        node = ir.node("Squeeze", [value, axes], name=base)
    else:
        shape = _constant(graph, np.array(target, np.int64), f"{base}_shape")
        node = ir.node("Expand", [value, shape], name=base)
    result = node.outputs[0]
    result.name, result.dtype = base, value.dtype
    result.shape = ir.Shape([d if isinstance(d, int) else None for d in target]) if how == "expand" else None
    if how != "expand":
        source = list(value.shape)
        result.shape = ir.Shape([1] * rank_gap + source if how == "unsqueeze" else source[-rank_gap:])
    graph.append(node)
    graph.outputs[index] = result


def unify_output(node: ir.Node, index: int) -> bool:
    """Make output ``index`` of the If ``node`` one shape in both branches; True if it rewrote."""
    branches = [node.attributes["then_branch"].value, node.attributes["else_branch"].value]
    values = [b.outputs[index] for b in branches]
    shapes = [v.shape for v in values]
    if any(s is None for s in shapes) or _same(*shapes):
        return False
    output = node.outputs[index]
    declared = output.shape
    low, high = sorted((0, 1), key=lambda i: len(shapes[i]))
    if _leading_ones_apart(shapes[low], shapes[high]):
        if declared is not None and _same(declared, shapes[low]):
            _end_branch_in(branches[high], index, _dims(shapes[low]), "squeeze")
            return True
        if (declared is not None and _same(declared, shapes[high])) or _reads_broadcasting(output):
            _end_branch_in(branches[low], index, _dims(shapes[high]), "unsqueeze")
            output.shape = ir.Shape(list(shapes[high]))
            return True
        return False
    target = _broadcast_target(*shapes)
    if target is None or not _reads_broadcasting(output, expand_to=target):
        return False
    for branch, shape in zip(branches, shapes):
        if _dims(shape) != target:
            _end_branch_in(branch, index, target, "expand")
    output.shape = ir.Shape(target)
    return True


def unify_if_branches(model: ir.Model) -> int:
    """Every If output whose branches differ in shape in a way that can be unified; returns how many."""
    count = 0
    for graph in iter_graphs(model.graph):
        for node in graph:
            if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
                continue
            if "then_branch" not in node.attributes or "else_branch" not in node.attributes:
                continue
            for index in range(len(node.outputs)):
                count += unify_output(node, index)
    return count


def branch_shape_mismatches(node: ir.Node) -> list[str]:
    """For an If: each output whose branches still differ in shape, in words (for a backend's refusal)."""
    branches = [node.attributes["then_branch"].value, node.attributes["else_branch"].value]
    found = []
    for index, (a, b) in enumerate(zip(branches[0].outputs, branches[1].outputs)):
        if a.shape is not None and b.shape is not None and not _same(a.shape, b.shape):
            found.append(f"output {index} is {list(_dims_text(a.shape))} in then_branch and "
                         f"{list(_dims_text(b.shape))} in else_branch")
    return found


def _dims_text(shape: ir.Shape):
    return [d if isinstance(d, int) else (d.value or "?") for d in shape]


@dataclass
class UnifyIfBranches:
    """The registered pass (``edgebuild.protocols.GraphPass``)."""

    name: str = "unify_if_branches"
    description: str = (
        "If outputs a branch gives in another shape ([] vs [1], [N] vs [1, N], a 1 its readers broadcast) "
        "-> one shape, by an Unsqueeze, Squeeze or Expand at the end of that branch"
    )
    default: bool = True
    before_folding: bool = False
    min_opset: int | None = None

    def apply(self, model: ir.Model) -> int:
        return unify_if_branches(model)


def graph_pass(name: str = "unify_if_branches") -> UnifyIfBranches:
    return UnifyIfBranches(name=name)


PASS = UnifyIfBranches()
