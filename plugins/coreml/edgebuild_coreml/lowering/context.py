"""What a lowering function sees: MIL vars for ONNX values, constants, attributes, the target.

The converter (``converter.py``) walks the ONNX graph in topological order inside a MIL
``Function`` and calls one lowering per node with a :class:`LoweringContext`.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np
import onnx_ir as ir

from edgebuild.plugin import unique_name
from edgebuild.plugin.graph import int_range_reason
from edgebuild_coreml.lowering.errors import DeclinedForm, LoweringError, TargetTooOld

TARGETS = ("iOS15", "iOS16", "iOS17", "iOS18", "iOS26")
_INT32 = np.iinfo(np.int32)


def target_index(name: str) -> int:
    """Order of deployment targets; macOS names map to their iOS twins."""
    aliases = {"macOS12": "iOS15", "macOS13": "iOS16", "macOS14": "iOS17", "macOS15": "iOS18", "macOS26": "iOS26"}
    return TARGETS.index(aliases.get(name, name))


def unique_identifier(name: str, taken: set[str], *, prefix: str, empty: str) -> str:
    """``name`` made a valid MIL identifier (``prefix`` before a leading digit, ``empty`` for
    nothing left) and unique within ``taken``, which it is then added to."""
    base = re.sub(r"[^A-Za-z0-9_]", "_", name)
    if not base:
        base = empty
    elif base[0].isdigit():
        base = prefix + base
    return unique_name(base, taken)


class LoweringContext:
    """State shared by the lowerings of one graph.

    ``opset``: the model's ai.onnx opset. ``target``: deployment target name (``"iOS17"``).
    ``precision``: ``"float16"`` or ``"float32"`` (compute precision of the artifact; the
    lowering emits fp32 and coremltools' pass pipeline casts).
    """

    def __init__(self, opset: int, target: str = "iOS17", precision: str = "float16"):
        self.opset = opset
        self.target = target
        self.precision = precision
        self.vars: dict[str, Any] = {}  # ONNX value name -> MIL Var
        self.consts: dict[str, np.ndarray] = {}  # ONNX value name -> constant numpy value
        self._names: set[str] = set()
        # Set by the converter: the lowering of a node (or None), the opset of a domain,
        # and a way to lower an If/Loop body (see converter.lower_subgraph).
        self.lookup: Callable[[ir.Node], Callable | None] = lambda node: None
        self.owner_of: Callable[[ir.Node], str | None] = lambda node: None  # the plugin a lowering is from (None: ours)
        self.opset_for: Callable[[str], int] = lambda domain: opset if domain == "" else 1
        self.lower_subgraph: Callable[[ir.Graph, list], list] | None = None
        self.notes: dict[str, int] = {}  # what the artifact does differently from the source -> how often

    def note(self, message: str) -> None:
        """Record something the report should say about the artifact (counted, said once)."""
        self.notes[message] = self.notes.get(message, 0) + 1

    # -- values -------------------------------------------------------------------------
    def input(self, node: ir.Node, index: int, *, optional: bool = False):
        """The MIL Var (or constant numpy array) for ``node.inputs[index]``; None if absent."""
        value = node.inputs[index] if index < len(node.inputs) else None
        if value is None or value.name == "":
            if optional:
                return None
            raise LoweringError(f"{self.where(node)}: input {index} is required but missing")
        found = self.get(value)
        if isinstance(found, np.ndarray):  # a constant used as a tensor: Core ML has no 64-bit types
            # nor uint32 (an input of that type is int32): such a constant meets int32 operands
            if found.dtype.kind in "iu" and (found.dtype.itemsize == 8 or found.dtype == np.uint32):
                return self.int32(found, node, f"input {index} ({value.name!r})")
            if found.dtype == np.float64:
                return found.astype(np.float32)
        return found

    def has_input(self, node: ir.Node, index: int) -> bool:
        return index < len(node.inputs) and node.inputs[index] is not None and node.inputs[index].name != ""

    def get(self, value: ir.Value):
        if value.name in self.vars:
            return self.vars[value.name]
        if value.name in self.consts:
            return self.consts[value.name]
        raise LoweringError(f"value {value.name!r} is used before it is produced")

    def set(self, value: ir.Value, var) -> None:
        self.vars[value.name] = var

    def const(self, node: ir.Node, index: int, *, optional: bool = False, what: str = "") -> np.ndarray | None:
        """The constant value of ``node.inputs[index]`` as numpy, or raise if it is a runtime tensor.

        Use for operands MIL requires to be compile-time constants (axes, perm, pads,
        shapes). ``what`` names the operand in the error.
        """
        value = node.inputs[index] if index < len(node.inputs) else None
        if value is None or value.name == "":
            if optional:
                return None
            raise LoweringError(f"{self.where(node)}: input {index} is required but missing")
        array = self.const_value(value)
        if array is None:
            operand = what or f"input {index}"
            source = runtime_origin(value)
            self.decline(
                node,
                f"{operand} must be a constant known at build time (MIL takes it as a compile-time parameter); "
                f"here {operand} comes from "
                f"{source or f'{value.name!r}, computed at run time'}",
                hint="pin the input shapes in the recipe so shape arithmetic folds, or make it an initializer",
            )
        return array

    def const_value(self, value: ir.Value) -> np.ndarray | None:
        if value.name in self.consts:
            return self.consts[value.name]
        var = self.vars.get(value.name)
        if var is not None and getattr(var, "val", None) is not None:
            return np.asarray(var.val)
        return None

    # -- attributes ---------------------------------------------------------------------
    @staticmethod
    def attr(node: ir.Node, name: str, default: Any = None) -> Any:
        """An attribute's Python value: int, float, str, list, or numpy array for tensors."""
        attribute = node.attributes.get(name)
        if attribute is None:
            return default
        value = attribute.value
        if isinstance(value, ir.TensorProtocol):
            return value.numpy()
        if isinstance(value, (list, tuple)):
            return list(value)
        return value

    # -- naming and errors --------------------------------------------------------------
    def name(self, node: ir.Node, suffix: str = "") -> str:
        """A unique MIL op name derived from the node's (or its first output's) name."""
        base = node.name or (node.outputs[0].name if node.outputs else node.op_type)
        return self.name_for(base, suffix)

    def name_for(self, base: str, suffix: str = "") -> str:
        """A unique MIL op name from a plain string (for ops not tied to one node)."""
        return unique_identifier(base + (f"_{suffix}" if suffix else ""), self._names, prefix="op_", empty="op_")

    def reserve(self, names) -> None:
        """Keep ``names`` (graph input/output names) from being handed out to ops."""
        self._names.update(names)

    @staticmethod
    def where(node: ir.Node) -> str:
        domain = f"{node.domain}::" if node.domain else ""
        return f"node {node.name or '<unnamed>'!r} ({domain}{node.op_type})"

    def require_target(self, node: ir.Node, minimum: str, why: str = "") -> None:
        """Raise unless the deployment target is at least ``minimum``."""
        if target_index(self.target) < target_index(minimum):
            raise TargetTooOld(
                f"{self.where(node)} needs deployment target {minimum} or newer{': ' + why if why else ''}; "
                f"the recipe targets {self.target}",
                hint=f"set target.deployment_target: {minimum}",
            )

    def decline(self, node: ir.Node, reason: str, hint: str | None = None):
        """Raise :class:`DeclinedForm`: the op has a lowering, but not for this node's form. ``reason``
        names the attribute, operand, rank or dtype ("direction 'reverse' is not supported")."""
        raise DeclinedForm(f"{self.where(node)}: {reason}", hint=hint, node=node.name, op_type=node.op_type,
                           domain=node.domain, reason=reason)

    # A lowering that cannot lower a node declines its form: one mechanism, one message.
    fail = decline

    @staticmethod
    def int32(array: np.ndarray, node: ir.Node | None = None, what: str = "constant") -> np.ndarray:
        """int64 -> int32 with a range check (Core ML has no int64 tensors)."""
        array = np.asarray(array)
        if array.dtype.kind in "iu" and array.size and (array.min() < _INT32.min or array.max() > _INT32.max):
            where = LoweringContext.where(node) if node is not None else "a constant"
            reason = int_range_reason(node) if node is not None else None  # why the graph pass kept them
            raise LoweringError(f"{where}: {what} holds values outside int32, which Core ML cannot represent"
                                + (f"; {reason}" if reason else ""))
        return array.astype(np.int32) if array.dtype.kind in "iu" else array


def runtime_origin(value: ir.Value) -> str | None:
    """Where a value that is not constant at build time comes from, in words: the ``Shape`` of a
    tensor with a dim the graph leaves symbolic, or a graph input's run-time data (None: neither found)."""
    seen: set[int] = set()
    queue, runtime_input = [value], None
    while queue:
        current = queue.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        producer = current.producer()
        if producer is None:
            if current.is_graph_input() and current.const_value is None and runtime_input is None:
                runtime_input = current
            continue
        if producer.op_type == "Shape" and producer.domain in ("", "ai.onnx"):
            source = producer.inputs[0]
            if source.shape is None:
                return f"Shape of {source.name!r}, whose rank is unknown"
            dims = list(source.shape)
            start = LoweringContext.attr(producer, "start", 0)
            end = LoweringContext.attr(producer, "end", None)
            symbolic = [i for i in range(len(dims))[start:end] if not isinstance(dims[i], int)]
            if symbolic:
                which = "input" if source.is_graph_input() else "tensor"
                listed = ", ".join(str(i) for i in symbolic)
                return f"Shape of the {which} {source.name!r}, whose dim {listed} is not fixed"
            continue
        queue.extend(producer.inputs)
    if runtime_input is not None:
        return f"the run-time data of the graph input {runtime_input.name!r}"
    return None
