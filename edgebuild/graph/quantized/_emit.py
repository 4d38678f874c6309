"""Building replacement nodes in place: the small toolkit the decomposition passes share.

An :class:`Emitter` collects new nodes and inserts them before an anchor node, registers new
initializers under names unused in the graph, and spells ops whose signature changed across
ai.onnx opsets (Unsqueeze, Squeeze) for the model's own opset, which the passes never raise.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

QUANTIZED_TYPES = (ir.DataType.INT8, ir.DataType.UINT8)
MS_DOMAIN = "com.microsoft"


def const_array(value: ir.Value | None) -> np.ndarray | None:
    """A value's constant contents (initializer or Constant node), None when computed or overridable."""
    if value is None or value.is_graph_input():
        return None
    tensor = value.const_value
    if tensor is None:
        producer = value.producer()
        if producer is None or producer.op_type != "Constant" or producer.domain not in ("", "ai.onnx"):
            return None
        attr = producer.attributes.get("value")
        if attr is None or attr.type != ir.AttributeType.TENSOR:
            return None
        tensor = attr.value
    try:
        return tensor.numpy()
    except (FileNotFoundError, ValueError):
        return None



def is_constant(value: ir.Value | None) -> bool:
    """Whether the value is an initializer or a Constant node's output (without reading it)."""
    if value is None:
        return False
    if value.const_value is not None and not value.is_graph_input():
        return True
    producer = value.producer()
    return producer is not None and producer.op_type == "Constant" and producer.domain in ("", "ai.onnx")


def onnx_opset(model: ir.Model) -> int:
    for key in ("", "ai.onnx"):
        if key in model.opset_imports:
            return model.opset_imports[key]
    return 1


def only_consumer(value: ir.Value) -> ir.Node | None:
    """The single node reading ``value`` (once), when nothing else reads it and it is no graph output."""
    uses = list(value.uses())
    if len(uses) != 1 or value.is_graph_output():
        return None
    return uses[0].node


def replace_output(graph: ir.Graph, old: ir.Value, new: ir.Value) -> None:
    """Point every reader of ``old`` (graph outputs included) at ``new``, which takes over its name."""
    name = old.name
    ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
    if new.type is None:
        new.type = old.type
    if new.shape is None and old.shape is not None:
        new.shape = old.shape
    old.name = None if name is None else f"{name}__replaced"
    new.name = name


class Emitter:
    """Creates nodes for one graph; :meth:`flush` inserts what was made before ``anchor``."""

    def __init__(self, graph: ir.Graph, opset: int):
        self.graph = graph
        self.opset = opset
        self._pending: list[ir.Node] = []
        self._names: set[str] = set(graph.initializers)
        for node in graph:
            self._names.update(v.name for v in node.outputs if v.name)
        self._names.update(v.name for v in graph.inputs if v.name)

    def fresh(self, base: str) -> str:
        name, n = base, 1
        while name in self._names:
            n += 1
            name = f"{base}_{n}"
        self._names.add(name)
        return name

    def const(self, array: np.ndarray, base: str) -> ir.Value:
        name = self.fresh(base)
        tensor = ir.tensor(np.ascontiguousarray(array).reshape(array.shape), name=name)  # keeps 0-d as 0-d
        value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype),
                         const_value=tensor)
        self.graph.register_initializer(value)
        return value

    def op(self, op_type: str, inputs, attributes: dict | None = None, *, domain: str = "",
           outputs: int = 1, name: str | None = None):
        node = ir.Node(domain, op_type, list(inputs), attributes=ir.convenience.convert_attributes(attributes or {}),
                       num_outputs=outputs, name=self.fresh(name) if name else None)
        for i, value in enumerate(node.outputs):
            value.name = self.fresh(f"{name or op_type}_out{i}")
        self._pending.append(node)
        return node.outputs[0] if outputs == 1 else tuple(node.outputs)

    def dequantize(self, x: ir.Value, scale: ir.Value, zero_point: ir.Value | None, axis: int | None,
                   name: str) -> ir.Value:
        # Per-axis DequantizeLinear is ai.onnx 13; an older model gets the axis attribute anyway: the
        # decomposed graph is only read by edgebuild's backends, whose DequantizeLinear lowerings
        # read ``axis`` whatever the opset (raising the opset would change other ops' meaning).
        inputs = [x, scale] + ([zero_point] if zero_point is not None else [])
        value = self.op("DequantizeLinear", inputs, {} if axis is None else {"axis": axis}, name=name)
        value.dtype = ir.DataType.FLOAT
        return value

    def unsqueeze(self, x: ir.Value, axes: list[int], name: str) -> ir.Value:
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.const(np.array(axes, np.int64), f"{name}_axes")], name=name)
        return self.op("Unsqueeze", [x], {"axes": axes}, name=name)

    def squeeze(self, x: ir.Value, axes: list[int], name: str) -> ir.Value:
        if self.opset >= 13:
            return self.op("Squeeze", [x, self.const(np.array(axes, np.int64), f"{name}_axes")], name=name)
        return self.op("Squeeze", [x], {"axes": axes}, name=name)

    def flush(self, anchor: ir.Node) -> None:
        if self._pending:
            self.graph.insert_before(anchor, self._pending)
            self._pending = []
