"""What a recipe needs to know about an ONNX model's inputs, read off its graph.

Only the graph is read (``load_external_data=False``): shapes and dtypes of the inputs, the
embedding tables integer inputs index, the ranges other ops show for them, and scalar inputs
compared with constants on the way to an ``If``/``Where`` (a branch selector, such as a
sample rate). Subgraphs count too: an ``If`` branch may use the outer graph's inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import onnx
from onnx import TensorProto, numpy_helper

from edgebuild.errors import UsageError

# ops that carry index values through unchanged (their first input to their first output)
INDEX_THROUGH = {"Cast", "Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Expand", "Transpose", "Tile"}
# ops between a stored embedding table and the Gather that reads it
TABLE_THROUGH = {"DequantizeLinear", "Cast", "Identity", "Mul", "Div", "Add", "Sub"}
COMPARE = {"Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"}
# ops between a comparison and the condition of an If / Where
CONDITION_THROUGH = {"Not", "And", "Or", "Xor", "Cast", "Identity", "Squeeze", "Unsqueeze", "Reshape"}
FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}
SMALL_CONSTANT = 64  # elements; larger initializers are never read


@dataclass
class Table:
    """An embedding-like table read by a ``Gather``."""

    name: str
    rows: int
    width: int | None  # None unless 2-d


@dataclass
class InputFacts:
    name: str
    dtype: str  # numpy's spelling, as recipes write it
    dims: list | None  # int (static), str (symbolic name) or None (unknown) per axis; None: rank unknown
    table: Table | None = None  # the float embedding table this integer input indexes
    int_range: tuple[int, int] | None = None  # [low, high) where the graph shows it
    range_reason: str = ""
    branch_values: list = field(default_factory=list)  # constants compared with on the way to a branch
    branch_op: str = ""

    @property
    def is_integer(self) -> bool:
        return self.dtype.startswith(("int", "uint"))

    @property
    def is_float(self) -> bool:
        return self.dtype.startswith(("float", "bfloat"))

    @property
    def is_scalar(self) -> bool:
        return self.dims is not None and all(d == 1 for d in self.dims)

    @property
    def image_layout(self) -> str | None:
        """``nchw`` / ``nhwc`` for a float rank-4 input with 1, 3 or 4 channels, else None."""
        if not self.is_float or self.dims is None or len(self.dims) != 4:
            return None
        if self.dims[1] in (1, 3, 4) and self.dims[3] not in (1, 3, 4):
            return "nchw"
        if self.dims[3] in (1, 3, 4) and self.dims[1] not in (1, 3, 4):
            return "nhwc"
        return "nchw" if self.dims[1] in (1, 3, 4) else None


@dataclass
class ModelFacts:
    path: Path
    inputs: list[InputFacts]
    outputs: list[str]
    max_positions: int | None = None  # rows of a position table as wide as the token table


def _dtype_name(elem_type: int) -> str:
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem_type).name
    except (KeyError, TypeError, ValueError):
        return TensorProto.DataType.Name(elem_type).lower()


def _dims(value: onnx.ValueInfoProto) -> list | None:
    tensor = value.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    dims = []
    for d in tensor.shape.dim:
        if d.HasField("dim_value") and d.dim_value >= 0:  # Paddle writes -1 for a dynamic dim
            dims.append(int(d.dim_value))
        else:
            dims.append(d.dim_param or None)
    return dims


class _Graph:
    """Producers, consumers and small constants of a model, subgraphs included."""

    def __init__(self, model: onnx.ModelProto):
        self.consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
        self.producers: dict[str, onnx.NodeProto] = {}
        self.initializers: dict[str, onnx.TensorProto] = {}
        self._walk(model.graph)

    def _walk(self, graph: onnx.GraphProto) -> None:
        for init in graph.initializer:
            self.initializers.setdefault(init.name, init)
        for node in graph.node:
            for i, name in enumerate(node.input):
                if name:
                    self.consumers.setdefault(name, []).append((node, i))
            for name in node.output:
                self.producers[name] = node
            for attr in node.attribute:
                for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                    self._walk(sub)

    def constant(self, name: str):
        """The value of a small constant (initializer or Constant node), else None."""
        tensor = self.initializers.get(name)
        node = self.producers.get(name)
        if tensor is None and node is not None and node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    tensor = attr.t
                elif attr.name in ("value_int", "value_float"):
                    return onnx.helper.get_attribute_value(attr)
        if tensor is None or tensor.data_location == TensorProto.EXTERNAL:
            return None
        if _count(tensor.dims) > SMALL_CONSTANT:
            return None
        return numpy_helper.to_array(tensor)

    def table(self, name: str, depth: int = 0) -> tuple[list[int], bool] | None:
        """(dims, is_float) of a stored tensor, looking through dequantisation (DequantizeLinear,
        or Cast then Mul by a scale) to the largest stored operand; else None."""
        tensor = self.initializers.get(name)
        node = self.producers.get(name)
        if tensor is None and node is not None and node.op_type == "Constant":
            tensor = next((a.t for a in node.attribute if a.name == "value"), None)
        if tensor is not None:
            return list(tensor.dims), tensor.data_type in FLOAT_TYPES
        if node is None or node.op_type not in TABLE_THROUGH or depth > 8:
            return None
        found = [t for t in (self.table(i, depth + 1) for i in node.input if i) if t is not None]
        if not found:
            return None
        dims = max(found, key=lambda t: _count(t[0]))[0]
        if node.op_type == "Cast":
            return dims, _attr(node, "to") in FLOAT_TYPES
        return dims, node.op_type == "DequantizeLinear" or any(is_float for _, is_float in found)

    def uses(self, name: str, through: set[str]):
        """Every (node, input index) that reads ``name``'s values, looking through ``through`` ops."""
        seen, todo = set(), [name]
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            for node, index in self.consumers.get(current, []):
                yield node, index
                if node.op_type in through and index == 0 and node.output:
                    todo.append(node.output[0])


def _count(dims) -> int:
    count = 1
    for d in dims:
        count *= d
    return count


def _attr(node: onnx.NodeProto, name: str, default=None):
    for attr in node.attribute:
        if attr.name == name:
            return onnx.helper.get_attribute_value(attr)
    return default


def _read_index_uses(graph: _Graph, facts: InputFacts, gathers: set[str]) -> None:
    """Fill ``table`` / ``int_range`` of an integer input from the ops that read it."""
    for node, index in graph.uses(facts.name, INDEX_THROUGH):
        if node.op_type == "Gather" and index == 1:
            found = graph.table(node.input[0])
            if found is None or not found[0]:
                continue
            dims, is_float = found
            axis = _attr(node, "axis", 0)
            rows = dims[axis]
            gathers.add(node.name or node.output[0])
            if is_float and len(dims) == 2 and axis == 0:
                if facts.table is None or rows > facts.table.rows:
                    facts.table = Table(node.input[0], rows, dims[1])
            if facts.int_range is None or rows < facts.int_range[1]:
                facts.int_range = (0, rows)
                facts.range_reason = f"indexes {node.input[0]!r} ({rows} rows)"
        elif node.op_type == "OneHot" and index == 0:
            depth = graph.constant(node.input[1])
            if depth is not None:
                facts.int_range = (0, int(depth.item() if hasattr(depth, "item") else depth))
                facts.range_reason = f"one-hot of depth {facts.int_range[1]}"
        elif node.op_type == "Cast" and _attr(node, "to") == TensorProto.BOOL and facts.int_range is None:
            facts.int_range = (0, 2)
            facts.range_reason = "cast to bool"


def _reaches_condition(graph: _Graph, name: str) -> str:
    """The op (If / Where) whose condition ``name`` decides, or ''."""
    for node, index in graph.uses(name, CONDITION_THROUGH):
        if node.op_type in ("If", "Where") and index == 0:
            return node.op_type
    return ""


def _read_branch_uses(graph: _Graph, facts: InputFacts) -> None:
    """Constants a scalar input is compared with, when the comparison picks a branch."""
    for node, index in graph.uses(facts.name, INDEX_THROUGH):
        if node.op_type not in COMPARE:
            continue
        other = graph.constant(node.input[1 - index])
        if other is None or getattr(other, "size", 1) != 1:
            continue
        op = _reaches_condition(graph, node.output[0])
        if op:
            value = other.item() if hasattr(other, "item") else other
            if value not in facts.branch_values:
                facts.branch_values.append(value)
            facts.branch_op = facts.branch_op or op


def _max_positions(graph: _Graph, width: int, vocab: int, used: set[str]) -> int | None:
    """Rows of the largest other table as wide as the token table: position embeddings."""
    best = None
    for nodes in graph.consumers.values():
        for node, index in nodes:
            if node.op_type != "Gather" or index != 0 or (node.name or node.output[0]) in used:
                continue
            found = graph.table(node.input[0])
            if found and found[1] and len(found[0]) == 2 and found[0][1] == width and 16 <= found[0][0] < vocab:
                best = max(best or 0, found[0][0])
    return best


def probe_onnx(path: Path) -> ModelFacts:
    """Read ``path``'s graph (not its weights) into the facts ``edgebuild init`` writes from."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{path}: no such model file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises several types for a file that is not ONNX
        raise UsageError(f"{path}: not a readable ONNX model ({type(exc).__name__}: {exc})",
                         hint="init reads .onnx files; export PyTorch models with torch.onnx.export first") from None
    from edgebuild.recipe.input_names import first_unnamed, unnamed_input_message

    unnamed = first_unnamed(value.name for value in model.graph.input)
    if unnamed is not None:  # before anything is written from the model's names
        message, hint = unnamed_input_message(path, unnamed, len(model.graph.input))
        raise UsageError(message, hint=hint)
    graph = _Graph(model)
    inputs, gathers = [], set()
    for value in model.graph.input:
        if value.name in graph.initializers:  # old exporters list weights as inputs too
            continue
        facts = InputFacts(value.name, _dtype_name(value.type.tensor_type.elem_type), _dims(value))
        if facts.is_integer:
            _read_index_uses(graph, facts, gathers)
        if facts.dims is not None and facts.is_scalar:
            _read_branch_uses(graph, facts)
        inputs.append(facts)
    tokens = max((f for f in inputs if f.table), key=lambda f: f.table.rows, default=None)
    positions = _max_positions(graph, tokens.table.width, tokens.table.rows, gathers) if tokens else None
    return ModelFacts(path, inputs, [o.name for o in model.graph.output], positions)
