"""Shape arithmetic that the pinned dims make constant, folded where onnxscript's folding stops.

Backends take some operands as compile-time parameters (TopK's k, Reshape targets, Slice bounds,
Pad pads, Tile repeats, Resize sizes, Split sizes, Range limits, ...), and models compute them from
``Shape``. onnxscript's optimizer folds a ``Shape`` only when every dim of its input is static,
and a value only when all of its inputs are constants. Two forms escape it:

- a tensor whose shape is known in part: ``Shape(x)[1]`` of an ``x [N, 8]`` is 8 whatever N is
  (a flexible batch dim in the recipe, or a count a NonZero decided);
- a tensor whose shape no inference gave: the output of an ``If`` whose branches agree on a shape
  (onnx's inference leaves it untyped when the branches are typed only inside), or of an op of a
  domain onnx has no schema for that keeps its input's shape (``com.microsoft::Gelu``).

This pass gives those outputs the shape they have, follows the known elements of small integer
vectors through the shape arithmetic (Shape, Gather, Slice, Concat, Unsqueeze, Squeeze, Reshape,
Cast, the elementwise arithmetic and comparisons, Where, the reductions), turns every value whose
elements are all known into a constant, and lets onnxscript fold what then became foldable. A
Reshape target known but for one element takes -1 there (``[count, 4]`` -> ``[-1, 4]``).

A dim the data decides may still have a static bound (a TopK with k = Min(C, count) keeps at most
C): NonMaxSuppression's max_output_boxes_per_class (INT64_MAX in torchvision's exports) is lowered
to the bound of its box count, which selects the same boxes and gives a backend that preallocates
the selection a size it can hold.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from edgebuild.graph.external_data import iter_graphs
from edgebuild.registration import unique_name

MAX_ROUNDS = 8
MAX_ELEMENTS = 64  # shape vectors; a value longer than this is data, not shape arithmetic
MAX_DEPTH = 160  # producers a bound is read through (a two-stage detector's second NMS is ~100 ops from its first)
UNBOUNDED = 2**31  # a limit this large (torchvision's INT64_MAX) bounds nothing a backend can allocate

# ops of domains onnx has no schema for whose first output has the first input's shape and dtype
SHAPE_PRESERVING = {
    "com.microsoft": {"Gelu", "FastGelu", "QuickGelu", "BiasGelu", "SkipLayerNormalization",
                      "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization", "LayerNormalization",
                      "RotaryEmbedding", "BiasAdd", "BiasDropout"},
    "edgebuild": {"Silu", "Gelu", "RMSNorm"},
}

_ELEMENTWISE = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Min": np.minimum, "Max": np.maximum,
    "Equal": np.equal, "Less": np.less, "Greater": np.greater, "LessOrEqual": np.less_equal,
    "GreaterOrEqual": np.greater_equal, "And": np.logical_and, "Or": np.logical_or,
}
_UNARY = {"Neg": np.negative, "Abs": np.abs, "Not": np.logical_not, "Floor": np.floor, "Ceil": np.ceil,
          "Identity": lambda a: a, "Sign": np.sign}
_REDUCE = {"ReduceMin": np.min, "ReduceMax": np.max, "ReduceProd": np.prod, "ReduceSum": np.sum}


@dataclass
class Partial:
    """A small tensor (rank 0 or 1) whose elements are known where ``known`` says so."""

    values: np.ndarray
    known: np.ndarray

    @property
    def complete(self) -> bool:
        return bool(self.known.all())


def _standard(node: ir.Node) -> bool:
    return node.domain in ("", "ai.onnx")


def _const(value: ir.Value | None) -> np.ndarray | None:
    if value is None:
        return None
    tensor = value.const_value
    producer = value.producer()
    if tensor is None and producer is not None and producer.op_type == "Constant" and "value" in producer.attributes:
        tensor = producer.attributes["value"].value  # a Constant node left in a subgraph
    if tensor is None:
        return None
    if tensor.size > MAX_ELEMENTS:
        return None
    return tensor.numpy()


def _int_attr(node: ir.Node, name: str, default: int) -> int:
    attribute = node.attributes.get(name)
    return default if attribute is None else int(attribute.value)


class _Evaluator:
    """Known elements of the small integer (and boolean) values of a model."""

    def __init__(self, main: ir.Graph):
        self.main = main
        self.partials: dict[int, Partial] = {}

    def of(self, value: ir.Value | None) -> Partial | None:
        if value is None or value.name == "":
            return None
        found = self.partials.get(id(value))
        if found is not None:
            return found
        array = _const(value)
        if array is None or array.ndim > 1:
            return None
        return Partial(array, np.ones(array.shape, bool))

    def visit(self, node: ir.Node) -> None:
        if not _standard(node) or len(node.outputs) != 1:
            return
        try:
            result = self._evaluate(node)
        except (ValueError, IndexError, TypeError, ZeroDivisionError, OverflowError):
            return  # a form the rules below do not cover: the value stays unknown
        if result is not None and result.values.ndim <= 1 and result.values.size <= MAX_ELEMENTS:
            self.partials[id(node.outputs[0])] = result

    def _evaluate(self, node: ir.Node) -> Partial | None:
        op = node.op_type
        inputs = [self.of(v) for v in node.inputs]
        if op == "Shape":
            return _shape_of(node, self.main)
        if op == "Size":
            shape = node.inputs[0].shape
            if shape is None or not all(isinstance(d, int) for d in shape):
                return None
            return Partial(np.array(int(np.prod([int(d) for d in shape])), np.int64), np.ones((), bool))
        if op in _ELEMENTWISE:
            if len(inputs) < 2 or any(p is None for p in inputs):
                return None
            result = inputs[0]
            for other in inputs[1:]:
                result = Partial(_ELEMENTWISE[op](result.values, other.values),
                                 np.logical_and(*np.broadcast_arrays(result.known, other.known)))
            return result
        if op in ("Div", "Mod"):
            a, b = inputs[0], inputs[1]
            if a is None or b is None:
                return None
            known = np.logical_and(*np.broadcast_arrays(a.known, b.known))
            divisor = np.where(np.broadcast_to(b.known, known.shape) & (b.values != 0), b.values, 1)
            if op == "Div":
                values = _divide(a.values, divisor)
            else:
                values = np.fmod(a.values, divisor) if _int_attr(node, "fmod", 0) else np.mod(a.values, divisor)
            return Partial(values, known & (np.broadcast_to(b.values, known.shape) != 0))
        if op in _UNARY and inputs and inputs[0] is not None:
            return Partial(_UNARY[op](inputs[0].values), inputs[0].known)
        if op == "Cast" and inputs[0] is not None:
            dtype = ir.DataType(_int_attr(node, "to", 0)).numpy()
            return Partial(inputs[0].values.astype(dtype), inputs[0].known)
        if op == "Where":
            cond, a, b = inputs
            if cond is None or a is None or b is None:
                return None
            chosen = np.where(cond.values, a.values, b.values)
            known = np.where(cond.values, a.known, b.known) & np.broadcast_to(cond.known, chosen.shape)
            return Partial(chosen, known)
        if op == "Gather":
            data, indices = inputs[0], _const(node.inputs[1])
            if data is None or indices is None or data.values.ndim != 1 or indices.ndim > 1:
                return None
            return Partial(np.take(data.values, indices), np.take(data.known, indices))
        if op == "Slice":
            return _slice(node, inputs[0])
        if op == "Concat":
            if any(p is None for p in inputs) or any(p.values.ndim != 1 for p in inputs):
                return None
            dtype = np.result_type(*(p.values.dtype for p in inputs))
            return Partial(np.concatenate([p.values.astype(dtype) for p in inputs]),
                           np.concatenate([p.known for p in inputs]))
        if op in ("Unsqueeze", "Squeeze", "Reshape", "Flatten") and inputs and inputs[0] is not None:
            return _reshaped(node, inputs[0])
        if op in _REDUCE and inputs and inputs[0] is not None and inputs[0].complete:
            if len(node.inputs) > 1 and node.inputs[1] is not None and node.inputs[1].name:
                axes = _const(node.inputs[1])
                if axes is None or axes.size > 1 or (axes.size == 1 and int(axes.reshape(-1)[0]) not in (0, -1)):
                    return None
            value = _REDUCE[op](inputs[0].values)
            if _int_attr(node, "keepdims", 1) and inputs[0].values.ndim == 1:
                value = np.reshape(value, [1])
            return Partial(np.asarray(value, inputs[0].values.dtype), np.ones(np.shape(value), bool))
        return None


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ONNX Div: integers truncate toward zero (as onnxruntime's kernel), floats divide."""
    if np.asarray(a).dtype.kind in "iu" and np.asarray(b).dtype.kind in "iu":
        quotient = np.abs(a) // np.abs(b)
        return (np.sign(a) * np.sign(b) * quotient).astype(np.result_type(a, b))
    return np.true_divide(a, b)


def _shape_of(node: ir.Node, main: ir.Graph) -> Partial | None:
    source = node.inputs[0]
    shape = source.shape
    if shape is None or (source.is_graph_input() and source.graph is not main):
        return None  # a Loop body's input may change shape from one iteration to the next
    dims = list(shape)
    start, end = _int_attr(node, "start", 0), node.attributes.get("end")
    dims = dims[start:int(end.value) if end is not None else None]
    values = np.array([d if isinstance(d, int) else 0 for d in dims], np.int64)
    return Partial(values, np.array([isinstance(d, int) for d in dims], bool))


def _slice(node: ir.Node, data: Partial | None) -> Partial | None:
    if data is None or data.values.ndim != 1:
        return None
    bounds = [_const(v) if i < len(node.inputs) else None for i, v in enumerate(node.inputs[1:5], start=1)]
    starts, ends = bounds[0], bounds[1]
    axes = bounds[2] if len(bounds) > 2 else None
    steps = bounds[3] if len(bounds) > 3 else None
    if starts is None or ends is None or starts.size != 1:
        return None
    if len(node.inputs) > 3 and node.inputs[3] is not None and node.inputs[3].name and axes is None:
        return None  # runtime axes
    if axes is not None and int(axes.reshape(-1)[0]) not in (0, -1):
        return None
    if len(node.inputs) > 4 and node.inputs[4] is not None and node.inputs[4].name and steps is None:
        return None
    step = 1 if steps is None else int(steps.reshape(-1)[0])
    size = data.values.shape[0]
    start, end = (int(np.clip(int(b.reshape(-1)[0]), -size - 1, size + 1)) for b in (starts, ends))
    index = slice(start, end, step)
    return Partial(data.values[index], data.known[index])


def _reshaped(node: ir.Node, data: Partial) -> Partial | None:
    """Unsqueeze/Squeeze/Reshape/Flatten of a scalar or vector to a scalar or vector."""
    out = node.outputs[0]
    count = data.values.size
    if node.op_type in ("Unsqueeze", "Squeeze"):
        axes = _const(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
        if axes is None and "axes" in node.attributes:
            axes = np.asarray(node.attributes["axes"].value)
        if node.op_type == "Unsqueeze":
            if axes is None:
                return None
            rank = data.values.ndim + int(np.asarray(axes).size)
        else:
            dropped = int(np.asarray(axes).size) if axes is not None else sum(d == 1 for d in data.values.shape)
            rank = data.values.ndim - dropped
    elif node.op_type == "Flatten":
        return None
    else:
        target = _const(node.inputs[1])
        if target is None or target.ndim != 1:
            return None
        rank = int(target.size)
    if rank > 1 or (rank == 0 and count != 1):
        return None
    shape = () if rank == 0 else (count,)
    if out.shape is not None and len(out.shape) != rank:
        return None
    return Partial(data.values.reshape(shape), data.known.reshape(shape))


def _merged(shapes: list[ir.Shape | None]) -> ir.Shape | None:
    """The shape every one of ``shapes`` has: equal dims kept, differing dims unnamed."""
    if not shapes or any(s is None for s in shapes) or len({len(s) for s in shapes}) != 1:
        return None
    dims = []
    for column in zip(*shapes):
        names = {d if isinstance(d, int) else d.value for d in column}
        dims.append(names.pop() if len(names) == 1 else None)  # an equal int or dim name, else unknown
    return ir.Shape(dims)


def _better(old: ir.Shape | None, new: ir.Shape | None) -> bool:
    """``new`` says more than ``old`` (no dim of ``old`` it contradicts)."""
    if new is None:
        return False
    if old is None:
        return True
    if len(old) != len(new):
        return False
    gained = False
    for a, b in zip(old, new):
        if isinstance(a, int):
            if a != b:
                return False
        elif isinstance(b, int):
            gained = True
    return gained


def give_known_shapes(model: ir.Model) -> int:
    """Shapes of outputs no inference typed: If outputs whose branches agree, and the first output of
    the shape-preserving ops of domains onnx has no schema for. Returns how many it gave."""
    given = 0
    for graph in iter_graphs(model.graph):
        for node in graph:
            if node.op_type == "If" and _standard(node):
                branches = [node.attributes.get(name) for name in ("then_branch", "else_branch")]
                if any(b is None for b in branches):
                    continue
                for index, output in enumerate(node.outputs):
                    branch_outputs = [b.value.outputs[index] for b in branches if index < len(b.value.outputs)]
                    if len(branch_outputs) != 2:
                        continue
                    shape = _merged([v.shape for v in branch_outputs])
                    if _better(output.shape, shape):
                        output.shape = shape
                        given += 1
                    if output.dtype is None and branch_outputs[0].dtype is not None:
                        output.dtype = branch_outputs[0].dtype
            elif node.op_type in SHAPE_PRESERVING.get(node.domain, ()) and node.inputs and node.inputs[0] is not None:
                source, output = node.inputs[0], node.outputs[0]
                if _better(output.shape, source.shape):
                    output.shape = ir.Shape(list(source.shape))
                    given += 1
                if output.dtype is None:
                    output.dtype = source.dtype
    return given


def fold_known_values(model: ir.Model) -> int:
    """Replace every small value whose elements the shapes decide by a constant; returns how many."""
    evaluator = _Evaluator(model.graph)
    folded = 0
    taken = {v.name for g in iter_graphs(model.graph)
             for v in (*g.inputs, *g.initializers.values(), *(o for n in g for o in n.outputs))}
    for graph in iter_graphs(model.graph):
        for node in list(graph):
            evaluator.visit(node)
            if len(node.outputs) != 1:
                continue
            output = node.outputs[0]
            folded += _infer_one_reshape_dim(graph, node, evaluator, taken)
            partial = evaluator.partials.get(id(output))
            if partial is None or not partial.complete or output.const_value is not None or output.is_graph_output() \
                    or all(_const(v) is not None for v in node.inputs if v is not None):
                continue  # onnxscript folds a node of constants itself; graph outputs keep their producer
            dtype = output.dtype.numpy() if output.dtype is not None else partial.values.dtype
            array = np.asarray(partial.values).astype(dtype)
            name = unique_name(f"{output.name}_static", taken)
            constant = ir.Value(name=name, shape=ir.Shape(array.shape),
                                type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                                const_value=ir.tensor(array, name=name))
            graph.register_initializer(constant)
            ir.convenience.replace_all_uses_with(output, constant)
            folded += 1
    return folded


def _infer_one_reshape_dim(graph: ir.Graph, node: ir.Node, evaluator: _Evaluator, taken: set[str]) -> int:
    """A Reshape target known but for one element becomes a constant with -1 there: Reshape infers
    that dim from the element count, which is what the run-time value had to be. Backends then know
    every other dim of the result (a box tensor stays [N, 4] after a count NonZero decided)."""
    if node.op_type != "Reshape" or not _standard(node) or len(node.inputs) < 2 or node.inputs[1] is None:
        return 0
    target = node.inputs[1]
    partial = evaluator.partials.get(id(target))
    if target.const_value is not None or partial is None or partial.values.ndim != 1:
        return 0
    known = partial.values[partial.known]
    if np.count_nonzero(~partial.known) != 1 or (known <= 0).any():
        return 0  # a 0 copies a dim (or is a 0 dim with allowzero) and a -1 is already inferred: keep them apart
    array = np.where(partial.known, partial.values, -1).astype(np.int64)
    name = unique_name(f"{target.name}_one_inferred", taken)
    constant = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.INT64),
                        const_value=ir.tensor(array, name=name))
    graph.register_initializer(constant)
    node.replace_input_with(1, constant)
    return 1


_SAME_SHAPE = {"Cast", "Identity", "Relu", "Sigmoid", "Exp", "Log", "Neg", "Abs", "Clip", "Softmax", "Sqrt",
               "Floor", "Ceil", "Round", "Not", "Tanh", "Erf", "Reciprocal"}
_BROADCAST = {"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Min", "Max", "Equal", "Less", "Greater", "LessOrEqual",
              "GreaterOrEqual", "And", "Or", "Xor", "Where"}


_BOUNDS: dict | None = None  # (value, axis) -> bound, while one dim_upper_bound call reads a graph


def dim_upper_bound(value: ir.Value, axis: int, depth: int = 0) -> int | None:
    """A static upper bound of ``value``'s dim ``axis`` when the dim itself is decided at run time (a count
    NonZero, TopK with k = Min(C, count), Compress took), read through the ops that keep or sum it; None
    when no producer bounds it. Each (value, axis) is read once per call: a detector's box arithmetic
    reaches the same values along many paths."""
    global _BOUNDS
    if _BOUNDS is None:
        _BOUNDS = {}
        try:
            return dim_upper_bound(value, axis, depth)
        finally:
            _BOUNDS = None
    key = (id(value), axis)
    if key not in _BOUNDS:
        _BOUNDS[key] = None  # a value reached again while it is being read (a Loop's carried value) is unknown
        _BOUNDS[key] = _dim_upper_bound(value, axis, depth)
    return _BOUNDS[key]


def _dim_upper_bound(value: ir.Value, axis: int, depth: int) -> int | None:
    shape = _rank_shape(value, depth)
    if shape is None or not -len(shape) <= axis < len(shape) or depth > MAX_DEPTH:
        return None
    axis %= len(shape)
    if isinstance(shape[axis], int):
        return shape[axis]
    node = value.producer()
    if node is None:
        return None
    op, inputs = node.op_type, node.inputs
    again = lambda v, a: dim_upper_bound(v, a, depth + 1) if v is not None else None  # noqa: E731
    if node.domain == "edgebuild" and op == "Linear" and axis < len(shape) - 1:
        return again(inputs[0], axis)  # the fused Gemm/MatMul keeps its rows
    if not _standard(node):
        return None
    if op in _SAME_SHAPE or (op in ("Slice", "Compress") and node.outputs[0] is value):
        return again(inputs[0], axis)
    if op == "TopK" and axis == _int_attr(node, "axis", -1) % len(shape):
        bound = _upper_value(inputs[1], depth + 1)
        source = again(inputs[0], axis)
        return min(b for b in (bound, source) if b is not None) if bound is not None or source is not None else None
    if op == "TopK" or (op == "Split" and axis != _int_attr(node, "axis", 0) % len(shape)):
        return again(inputs[0], axis)
    if op == "Concat":
        along = _int_attr(node, "axis", 0) % len(shape)
        bounds = [again(v, axis) for v in inputs]
        if along == axis:
            return sum(bounds) if all(b is not None for b in bounds) else None
        return min((b for b in bounds if b is not None), default=None)
    if op in _BROADCAST:
        bounds = []
        for v in inputs:
            operand = _rank_shape(v, depth + 1) if v is not None else None
            if operand is None:
                return None
            offset = axis - (len(shape) - len(operand))
            bounds.append(1 if offset < 0 else again(v, offset))
        return None if any(b is None for b in bounds) else max(bounds)
    if op == "Transpose":
        perm = node.attributes.get("perm")
        return again(inputs[0], list(perm.value)[axis]) if perm is not None else None
    if op in ("Unsqueeze", "Squeeze") and _rank_shape(inputs[0], depth + 1) is not None:
        axes = _const(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else None
        if axes is None:
            return None
        rank_in, rank_out = len(_rank_shape(inputs[0], depth + 1)), len(shape)
        axes = sorted(int(a) % (rank_out if op == "Unsqueeze" else rank_in) for a in np.asarray(axes).reshape(-1))
        if op == "Unsqueeze":
            return None if axis in axes else again(inputs[0], axis - sum(a < axis for a in axes))
        kept = [a for a in range(rank_in) if a not in axes]
        return again(inputs[0], kept[axis])
    if op in ("Reshape", "Flatten") and isinstance(shape[axis], ir.SymbolicDim) and shape[axis].value is not None:
        source = _rank_shape(inputs[0], depth + 1) or ()
        named = [a for a, d in enumerate(source) if isinstance(d, ir.SymbolicDim) and d.value == shape[axis].value]
        if named:  # inference named the dim after the input's: the same count
            return again(inputs[0], named[0])
    if op in ("ScatterElements", "ScatterND", "Scatter"):
        return again(inputs[0], axis)
    if op == "Gemm" and axis == 0:
        return again(inputs[0], 1 if _int_attr(node, "transA", 0) else 0)
    if op == "MatMul" and axis < len(shape) - 1:  # the rows of A (a batch dim of either)
        left = _rank_shape(inputs[0], depth + 1)
        offset = axis - (len(shape) - len(left)) if left is not None else -1
        return again(inputs[0], offset) if offset >= 0 else None
    if op == "RoiAlign" and axis == 0:
        return again(inputs[1], 0)
    if op == "If":  # the larger of what either branch gives
        index = list(node.outputs).index(value)
        branches = [node.attributes.get(name) for name in ("then_branch", "else_branch")]
        bounds = [again(b.value.outputs[index], axis) if b is not None else None for b in branches]
        return None if any(b is None for b in bounds) else max(bounds)
    if op == "NonMaxSuppression" and axis == 0:  # at most the limit (or every box) of each batch and class
        scores = _rank_shape(inputs[1], depth + 1)
        boxes = again(inputs[0], 1)
        limit = _const(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else None
        limit = None if limit is None or int(limit.reshape(-1)[0]) >= UNBOUNDED else int(limit.reshape(-1)[0])
        per_class = min((b for b in (boxes, limit) if b is not None), default=None)
        outer = [again(inputs[1], a) for a in (0, 1)] if scores is not None and len(scores) == 3 else [None]
        return None if per_class is None or None in outer else per_class * int(np.prod(outer))
    if op in ("Reshape", "Flatten"):
        # the one run-time dim of the result holds at most the input's elements over the static dims' product
        others = [d for a, d in enumerate(shape) if a != axis]
        count = _count_bound(inputs[0], depth + 1)
        if count is None or not all(isinstance(d, int) and d > 0 for d in others):
            return None
        return count // int(np.prod(others, dtype=np.int64))
    if op == "Gather":
        data, indices = inputs
        along = _int_attr(node, "axis", 0) % len(data.shape) if data.shape is not None else None
        if along is None or indices.shape is None:
            return None
        if axis < along:
            return again(data, axis)
        if axis < along + len(indices.shape):
            return again(indices, axis - along)
        return again(data, axis - len(indices.shape) + 1)
    if op in ("GatherND", "NonZero"):
        return _count_bound(inputs[0] if op == "NonZero" else inputs[1], depth + 1)
    if op == "ConstantOfShape":
        return _element_bound(inputs[0], axis, depth + 1)
    return None


def _rank_shape(value: ir.Value | None, depth: int) -> tuple | None:
    """``value``'s shape, or where no inference typed it (a value in an If branch that reads an outer
    constant) one with its rank and static dims read from its producer: the shape-keeping ops, Unsqueeze
    by constant axes, the broadcasting ops; None when neither says."""
    if value is None or depth > MAX_DEPTH:
        return None
    if value.shape is not None:
        return tuple(value.shape)
    node = value.producer()
    if node is None or not _standard(node) or not node.inputs:
        return None
    if node.op_type in _SAME_SHAPE:
        return _rank_shape(node.inputs[0], depth + 1)
    if node.op_type == "Unsqueeze" and len(node.inputs) > 1:
        source, axes = _rank_shape(node.inputs[0], depth + 1), _const(node.inputs[1])
        if source is None or axes is None:
            return None
        rank = len(source) + axes.size
        axes = {int(a) % rank for a in axes.reshape(-1)}
        rest = iter(source)
        return tuple(1 if a in axes else next(rest) for a in range(rank))
    if node.op_type in _BROADCAST:
        shapes = [_rank_shape(v, depth + 1) for v in node.inputs]
        if any(s is None for s in shapes):
            return None
        rank = max(len(s) for s in shapes)
        padded = [(1,) * (rank - len(s)) + s for s in shapes]
        return tuple(max(column) if all(isinstance(d, int) for d in column) else None for column in zip(*padded))
    return None


def _element_bound(vector: ir.Value, index: int, depth: int) -> int | None:
    """An upper bound of element ``index`` of a shape vector: a constant, a dim of a Shape, a part of a Concat."""
    array = _const(vector)
    if array is not None:
        return int(array.reshape(-1)[index]) if index < array.size else None
    node = vector.producer()
    if node is None or not _standard(node) or depth > MAX_DEPTH:
        return None
    if node.op_type in ("Cast", "Identity", "Unsqueeze", "Squeeze", "Reshape"):  # the same elements in order
        return _element_bound(node.inputs[0], index, depth + 1)
    if node.op_type == "Gather" and _int_attr(node, "axis", 0) == 0:
        picked = _const(node.inputs[1])
        return _element_bound(node.inputs[0], int(picked.reshape(-1)[index]), depth + 1) \
            if picked is not None and index < picked.size else None
    if node.op_type == "Shape" and _int_attr(node, "start", 0) >= 0:
        return dim_upper_bound(node.inputs[0], _int_attr(node, "start", 0) + index, depth + 1)
    if node.op_type == "Concat":
        for part in node.inputs:
            length = part.shape[0] if part is not None and part.shape is not None and len(part.shape) == 1 else None
            if not isinstance(length, int):
                return None
            if index < length:
                return _element_bound(part, index, depth + 1)
            index -= length
    return None


def _count_bound(value: ir.Value, depth: int) -> int | None:
    """An upper bound of ``value``'s element count: the product of its dims' bounds."""
    if value is None or value.shape is None:
        return None
    bounds = [dim_upper_bound(value, a, depth) for a in range(len(value.shape))]
    return None if any(b is None for b in bounds) else int(np.prod(bounds, dtype=np.int64))


def _upper_value(value: ir.Value, depth: int) -> int | None:
    """An upper bound of the one integer ``value`` holds: a constant, or Min/ReduceMin with a constant
    among its operands (TopK's k = Min(C, count)), through Reshape/Unsqueeze/Squeeze/Cast/Concat."""
    if value is None or depth > MAX_DEPTH:
        return None
    array = _const(value)
    if array is not None:
        return int(np.max(array)) if array.size else None
    node = value.producer()
    if node is None or not _standard(node):
        return None
    if node.op_type in ("Reshape", "Unsqueeze", "Squeeze", "Cast", "Identity"):
        return _upper_value(node.inputs[0], depth + 1)
    if node.op_type in ("Min", "ReduceMin"):
        operands = list(node.inputs) if node.op_type == "Min" else [node.inputs[0]]
        gathered = operands[0].producer() if node.op_type == "ReduceMin" and operands[0] is not None else None
        if gathered is not None and gathered.op_type == "Concat" and _standard(gathered):
            operands = list(gathered.inputs)  # the least of a vector is at most the least bound of its parts
        bounds = [_upper_value(v, depth + 1) for v in operands]
        return min((b for b in bounds if b is not None), default=None)
    if node.op_type in ("Concat", "Max", "ReduceMax"):
        bounds = [_upper_value(v, depth + 1) for v in node.inputs[:None if node.op_type != "ReduceMax" else 1]]
        return None if any(b is None for b in bounds) else max(bounds)
    return None


def bound_nms_outputs(model: ir.Model) -> int:
    """NonMaxSuppression's max_output_boxes_per_class lowered to the static bound of its box count when
    that is smaller (torchvision writes sys.maxsize): NMS never selects more boxes than it has, so the
    result is the same, and a backend that preallocates the selection (Core ML) gets a size it can hold."""
    lowered = 0
    for graph in iter_graphs(model.graph):
        for node in graph:
            if node.op_type != "NonMaxSuppression" or not _standard(node) or len(node.inputs) < 3:
                continue
            limit = _const(node.inputs[2]) if node.inputs[2] is not None else None
            bound = dim_upper_bound(node.inputs[0], 1)
            if limit is None or limit.size != 1 or bound is None or int(limit.reshape(-1)[0]) <= bound:
                continue
            array = np.array([bound], np.int64).reshape(limit.shape)
            name = f"{node.name or 'nms'}_max_output_bound"
            constant = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.INT64),
                                const_value=ir.tensor(array, name=name))
            if name in graph.initializers:
                continue
            graph.register_initializer(constant)
            node.replace_input_with(2, constant)
            lowered += 1
    return lowered


@dataclass
class FoldStaticValues:
    """The registered pass (``edgebuild.protocols.GraphPass``); after onnxscript's folding, first of
    the passes there, so later rewrites and the backend see the constants."""

    name: str = "fold_static_values"
    description: str = (
        "shape arithmetic the pinned dims decide (a known dim of a partly symbolic shape, the shape of "
        "an If whose branches agree or of a shape-preserving custom op) -> constants; NonMaxSuppression's "
        "output limit -> the static bound of its box count"
    )
    default: bool = True
    before_folding: bool = False
    min_opset: int | None = None

    def apply(self, model: ir.Model) -> int:
        import onnxscript.optimizer

        from edgebuild.graph.optimize import infer_shapes, keep_weight_transposes

        total = bound_nms_outputs(model)
        for _ in range(MAX_ROUNDS):
            changed = give_known_shapes(model) + fold_known_values(model)
            if not changed:
                break
            total += changed
            onnxscript.optimizer.fold_constants(model, should_fold=keep_weight_transposes)
            common_passes.RemoveUnusedNodesPass()(model)
        total += bound_nms_outputs(model) if total else 0
        if _unbounded_nms(model):  # values the folding left untyped (a detector's second stage): infer, then bound
            try:
                infer_shapes(model)
            except Exception:  # custom-domain ops are opaque to onnx's inference; keep what we have
                return total
            total += bound_nms_outputs(model)
        return total


def _unbounded_nms(model: ir.Model) -> bool:
    for graph in iter_graphs(model.graph):
        for node in graph:
            if node.op_type == "NonMaxSuppression" and _standard(node) and len(node.inputs) > 2:
                limit = _const(node.inputs[2]) if node.inputs[2] is not None else None
                if limit is not None and limit.size == 1 and int(limit.reshape(-1)[0]) >= UNBOUNDED:
                    return True
    return False


def graph_pass(name: str = "fold_static_values") -> FoldStaticValues:
    return FoldStaticValues(name=name)


PASS = FoldStaticValues()
