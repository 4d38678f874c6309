"""What an MPSGraph lowering sees while the graph is walked.

Lowerings call :meth:`LoweringContext.emit` to append MPSGraph ops. Every op is executed
eagerly by the reference executor on placeholder data as it is emitted, which gives each
tensor its exact shape and dtype (written to ``program.json``) and proves the program runs.
Values computable at build time (initializers, ``Shape`` of a static tensor and whatever
depends only on those) are folded with onnx's reference evaluator and never become ops.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import onnx_ir as ir

from edgebuild.plugin import BuildError
from edgebuild_mpsgraph.program import Op, Program


class LoweringContext:
    def __init__(self, opset: int):
        self.opset = opset
        self.program = Program()
        self.known: dict[str, np.ndarray] = {}  # ONNX value -> build-time value
        self.tensor_of: dict[str, str] = {}  # ONNX value -> program tensor
        self.eager: dict[str, np.ndarray] = {}  # program tensor -> placeholder-run value
        self._taken: set[str] = set()
        self.node: ir.Node | None = None
        self._node_ops_start = 0
        self._fresh_in_node: set[str] = set()

    # -- names ----------------------------------------------------------------------------
    def fresh(self, hint: str) -> str:
        base = re.sub(r"\s+", "_", hint) or "t"
        name, n = base, 1
        while name in self._taken:
            n += 1
            name = f"{base}_{n}"
        self._taken.add(name)
        return name

    def reserve(self, name: str) -> None:
        self._taken.add(name)

    # -- reading a node ---------------------------------------------------------------------
    def const(self, node: ir.Node, index: int) -> np.ndarray | None:
        """The build-time value of input ``index``, or None when it is only known at run time."""
        value = node.inputs[index] if index < len(node.inputs) else None
        return None if value is None else self.known.get(value.name)

    def has_input(self, node: ir.Node, index: int) -> bool:
        return index < len(node.inputs) and node.inputs[index] is not None and node.inputs[index].name != ""

    def input(self, node: ir.Node, index: int) -> str:
        """The program tensor of input ``index`` (a build-time value becomes a constant)."""
        value = node.inputs[index]
        if value.name in self.tensor_of:
            return self.tensor_of[value.name]
        if value.name in self.known:
            name = self.constant(self.known[value.name], value.name)
            self.tensor_of[value.name] = name
            return name
        raise BuildError(f"node {node.name!r} ({node.op_type}): input {value.name!r} is not produced in this segment")

    @staticmethod
    def attr(node: ir.Node, name: str, default: Any = None) -> Any:
        attribute = node.attributes.get(name)
        return default if attribute is None else attribute.value

    def shape(self, tensor: str) -> tuple[int, ...]:
        return self.program.tensors[tensor][1]

    def dtype(self, tensor: str) -> str:
        return self.program.tensors[tensor][0]

    # -- writing the program -------------------------------------------------------------------
    def constant(self, array, hint: str = "const") -> str:
        array = np.asarray(array)
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        name = self.fresh(hint)
        self.program.constants[name] = np.ascontiguousarray(array)
        self.program.tensors[name] = (array.dtype.name, tuple(array.shape))
        self.eager[name] = array
        return name

    def scalar(self, value, like: str) -> str:
        """A rank-0 constant of ``like``'s dtype (broadcasts against it)."""
        return self.constant(np.asarray(value, dtype=self.dtype(like)), f"{like}_scalar")

    def add_input(self, name: str, dtype: str, shape) -> None:
        self.reserve(name)
        self.program.inputs.append(name)
        self.program.tensors[name] = (dtype, tuple(int(d) for d in shape))
        self.eager[name] = np.zeros(shape, dtype=dtype)
        self.tensor_of[name] = name

    def emit(self, op: str, inputs: list[str], outputs: int = 1, **attrs) -> Any:
        """Append ``op``; returns its output tensor name (a list when ``outputs`` > 1)."""
        hint = f"{self.node.name or self.node.op_type}/{op}" if self.node is not None else op
        names = [self.fresh(hint) for _ in range(outputs)]
        self._fresh_in_node.update(names)
        record = Op(op, list(inputs), names, {k: _jsonable(v) for k, v in attrs.items()},
                    self.node.name if self.node is not None else "")
        # imported here: registering the lowerings (every run does, whatever its backend) needs no executor
        from edgebuild_mpsgraph.executor import evaluate_op

        try:
            with np.errstate(all="ignore"):  # placeholder data divides by zero, takes log(0)...
                results = evaluate_op(record, [self.eager[i] for i in inputs])
        except BuildError:
            raise
        except Exception as exc:
            raise BuildError(f"node {record.name!r}: MPSGraph op {op} fails on shapes "
                             f"{[self.shape(i) for i in inputs]}: {type(exc).__name__}: {exc}") from exc
        for name, result in zip(names, results):
            result = np.asarray(result)
            self.eager[name] = result
            self.program.tensors[name] = (result.dtype.name, tuple(result.shape))
        self.program.ops.append(record)
        return names[0] if outputs == 1 else names

    # -- node bookkeeping (the converter's) ------------------------------------------------------
    def begin(self, node: ir.Node | None) -> None:
        self.node = node
        self._node_ops_start = len(self.program.ops)
        self._fresh_in_node = set()

    def bind(self, value: ir.Value, tensor: str) -> None:
        """Make ``tensor`` the program tensor of ONNX ``value``, named after it when it is new."""
        if tensor in self._fresh_in_node and value.name not in self.program.tensors:
            self._rename(tensor, value.name)
            tensor = value.name
        self.tensor_of[value.name] = tensor

    def _rename(self, old: str, new: str) -> None:
        self._taken.add(new)
        for op in self.program.ops[self._node_ops_start:]:
            op.inputs = [new if i == old else i for i in op.inputs]
            op.outputs = [new if o == old else o for o in op.outputs]
        self.program.tensors[new] = self.program.tensors.pop(old)
        self.eager[new] = self.eager.pop(old)
        self._fresh_in_node.discard(old)

    def release(self, tensors) -> None:
        """Drop placeholder values no later op reads (keeps peak memory near one activation set)."""
        for tensor in tensors:
            if tensor not in self.program.constants:
                self.eager.pop(tensor, None)


def _jsonable(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value
