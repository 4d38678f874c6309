"""What an op converter works with: the ONNX graph being written, the MLIR values already
converted, types, constants, and errors that name the op and its Python source line.

A converter (``edgebuild_jax.convert.registry``) takes one MLIR op and returns the ONNX values
of its results. It reads operands with ``cx.inputs(op)``, emits nodes with ``cx.node(...)``, and
reads compile-time values with ``cx.constant_value(mlir_value)`` (None when not a constant).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import onnx_ir as ir

from edgebuild.plugin import BuildError
from edgebuild_jax.convert.locations import source_line
from edgebuild_jax.convert.types import onnx_dtype, tensor_shape, numpy_dtype

OPSET = 18  # the ONNX opset the converters write: Reduce* take axes as inputs, Pad takes axes
SMALL_CONSTANT = 64  # elements: constants up to this size become Constant nodes, larger ones initializers


@dataclass
class Scope:
    """One graph being written: the main graph, or a subgraph (a Loop or If body)."""

    graph: ir.Graph
    values: dict = field(default_factory=dict)  # MLIR value -> ONNX value
    parent: "Scope | None" = None

    def lookup(self, value):
        scope = self
        while scope is not None:
            found = scope.values.get(value)
            if found is not None:
                return found
            scope = scope.parent
        return None


class Conversion:
    """The state of converting one StableHLO module into one ONNX graph."""

    def __init__(self, module, graph: ir.Graph, *, origin: str):
        self.module = module
        self.origin = origin  # the source file's name, for messages
        self.scope = Scope(graph)
        self._names = itertools.count()
        self._constants: dict[int, np.ndarray] = {}  # id(ONNX value) -> its compile-time value
        self.functions = {str(op.attributes["sym_name"]).strip('"'): op
                          for op in module.body.operations if op.operation.name == "func.func"}

    # -- values --------------------------------------------------------------------------------

    def bind(self, mlir_value, onnx_value: ir.Value) -> None:
        self.scope.values[mlir_value] = onnx_value

    def value(self, mlir_value) -> ir.Value:
        found = self.scope.lookup(mlir_value)
        if found is None:
            raise BuildError(f"{self.origin}: a value is used before it is defined: {mlir_value.get_name()}")
        return found

    def inputs(self, op) -> list[ir.Value]:
        return [self.value(v) for v in op.operands]

    def constant_value(self, mlir_value) -> np.ndarray | None:
        """The compile-time value of an operand (a ``stablehlo.constant``, or a value the converters
        folded), else None."""
        onnx_value = self.scope.lookup(mlir_value)
        if onnx_value is None:
            return None
        return self.folded(onnx_value)

    def folded(self, onnx_value: ir.Value) -> np.ndarray | None:
        known = self._constants.get(id(onnx_value))
        if known is not None:
            return known
        if onnx_value.const_value is not None:
            return onnx_value.const_value.numpy()
        return None

    # -- emitting ------------------------------------------------------------------------------

    def fresh_name(self, hint: str = "v") -> str:
        return f"{hint}_{next(self._names)}"

    def node(self, op_type: str, inputs: Sequence[ir.Value | None], attributes: dict[str, Any] | None = None, *,
             outputs: int = 1, domain: str = "", name: str | None = None) -> ir.Value | tuple[ir.Value, ...]:
        """Append one ONNX node to the graph being written; its output value (a tuple when
        ``outputs`` > 1)."""
        attrs = [ir.convenience.convert_attribute(k, v) for k, v in (attributes or {}).items() if v is not None]
        node_name = self.fresh_name(name or op_type)
        values = [ir.Value(name=self.fresh_name(f"{node_name}_out")) for _ in range(outputs)]
        node = ir.Node(domain, op_type, inputs, attrs, outputs=values, name=node_name,
                       version=None, graph=None)
        self.scope.graph.append(node)
        return values[0] if outputs == 1 else tuple(values)

    def const(self, array, dtype=None, *, name: str = "const") -> ir.Value:
        """A compile-time tensor: a Constant node when small, an initializer otherwise."""
        array = np.asarray(array, dtype=dtype)
        if array.size <= SMALL_CONSTANT:
            value = self.node("Constant", [], {"value": ir.tensor(array, name=self.fresh_name(name))}, name=name)
        else:
            value = ir.Value(name=self.fresh_name(name), const_value=ir.tensor(array, name=None),
                             shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype)))
            value.const_value.name = value.name
            self.root_graph().register_initializer(value)
        self._constants[id(value)] = array
        return value

    def parameter(self, array: np.ndarray, name: str) -> ir.Value:
        """A weight known at build time (a bound argument): always an initializer."""
        value = ir.Value(name=self.fresh_name(name), const_value=ir.tensor(array),
                         shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype)))
        value.const_value.name = value.name
        self.root_graph().register_initializer(value)
        self._constants[id(value)] = array
        return value

    def ints(self, values: Iterable[int]) -> ir.Value:
        """A 1-D int64 constant (shapes, axes, starts)."""
        return self.const(np.asarray(list(values), dtype=np.int64), name="ints")

    def root_graph(self) -> ir.Graph:
        scope = self.scope
        while scope.parent is not None:
            scope = scope.parent
        return scope.graph

    # -- subgraphs -----------------------------------------------------------------------------

    def subgraph(self, name: str, build: Callable[[], Sequence[ir.Value]], inputs: Sequence[ir.Value] = ()) -> ir.Graph:
        """A graph attribute (a Loop or If body): ``build`` runs with the new graph as the one being
        written and returns its outputs; values of enclosing graphs are visible by name."""
        graph = ir.Graph(list(inputs), [], nodes=[], name=self.fresh_name(name))
        outer = self.scope
        self.scope = Scope(graph, parent=outer)
        try:
            outputs = list(build())
        finally:
            self.scope = outer
        for out in outputs:
            graph.outputs.append(self._owned_output(graph, out))
        return graph

    def _owned_output(self, graph: ir.Graph, value: ir.Value) -> ir.Value:
        """ONNX graph outputs must be produced inside the graph: pass others through Identity."""
        if value.producer() is not None and value.producer().graph is graph:
            return value
        identity = ir.Value(name=self.fresh_name("out"))
        graph.append(ir.Node("", "Identity", [value], outputs=[identity], name=self.fresh_name("Identity")))
        return identity

    def convert_block(self, block, arguments: Sequence[ir.Value]) -> list[ir.Value]:
        """Convert the ops of ``block`` (a region's only block) with its arguments bound to
        ``arguments``; the ONNX values of its terminator's operands."""
        from edgebuild_jax.convert.registry import convert_op

        for mlir_arg, onnx_arg in zip(block.arguments, arguments, strict=True):
            self.bind(mlir_arg, onnx_arg)
        terminator = None
        for op in block.operations:
            if op.operation.name in ("stablehlo.return", "func.return"):
                terminator = op
                break
            convert_op(op, self)
        if terminator is None:
            raise BuildError(f"{self.origin}: a region has no return")
        return self.inputs(terminator)

    def annotate(self, onnx_value: ir.Value, mlir_value) -> None:
        """Give ``onnx_value`` the MLIR value's element type and shape when it has none yet."""
        if onnx_value.type is None:
            onnx_value.type = ir.TensorType(self.dtype(mlir_value))
        if onnx_value.shape is None:
            onnx_value.shape = ir.Shape(self.shape(mlir_value))

    # -- types and errors ----------------------------------------------------------------------

    def shape(self, mlir_value) -> list[int | None]:
        return tensor_shape(mlir_value.type)

    def dtype(self, mlir_value) -> ir.DataType:
        return onnx_dtype(mlir_value.type, self.error_context(mlir_value))

    def np_dtype(self, mlir_value) -> np.dtype:
        return numpy_dtype(mlir_value.type, self.error_context(mlir_value))

    def error_context(self, mlir_value) -> str:
        owner = mlir_value.owner
        name = getattr(owner, "name", None)
        if isinstance(name, str):  # an op's result
            return f"{self.origin}: {name} at {source_line(owner.location)}"
        return f"{self.origin}: an argument"

    def error(self, op, message: str, hint: str | None = None) -> BuildError:
        """A BuildError naming the op and the Python line its location points at."""
        return BuildError(f"{self.origin}: {op.operation.name} at {source_line(op.location)}: {message}", hint=hint)


def attribute(op, name: str, default=None):
    """An op attribute, or ``default`` when the op does not carry it."""
    return op.attributes[name] if name in op.attributes else default


def int_list(attr) -> list[int]:
    """A DenseI64ArrayAttr or DenseIntElementsAttr as Python ints."""
    if attr is None:
        return []
    try:
        return [int(v) for v in attr]
    except TypeError:
        return [int(v) for v in np.asarray(attr).reshape(-1)]
