"""Convolutions and the activation after them, run by the compiled plan as one step.

A MobileNet-style net follows most convs with a ReLU or a hard-swish (``sigmoid_hard`` then
``mul`` by the conv's own output), and its squeeze-and-excite gates with a ``sigmoid_hard``.
Run op by op, each activation is one or three more passes
over a freshly written map, plus an op's bookkeeping; applied to the conv's result as it is
made (fused into torch's convolution where it is one), it costs a fraction of that.

A pair fuses only where the result is the one the ops give in turn: the conv's output (and the
gate's) read by the activation alone and no function output. A ReLU commutes with the rounding
of the conv's output to fp16, so it fuses whatever the types; a hard-swish or hard-sigmoid rounds
nowhere in between only on float32 outputs without fp16 emulation, so only there.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._params import param, scalar
from .plan import input_vars, is_constant_op, tensor_type_of


class Activation(NamedTuple):
    """What a conv's step applies to its result: ``relu``, ``hard_sigmoid``
    (``min(max(alpha * x + beta, 0), 1)``) or ``hard_swish`` (``x`` times that)."""

    kind: str
    alpha: float = 0.0
    beta: float = 0.0


class FusedActivation(NamedTuple):
    """A conv's activation: what it computes, the ops it stands for and the value it gives."""

    activation: Activation
    ops: tuple
    output: object  # the Var of the last op of ``ops``


def conv_activations(func, *, fp16: bool) -> dict:
    """{conv op: FusedActivation} of ``func``'s top-level ops (see the module's docstring)."""
    readers: dict = {}
    for op in func.operations:
        if not is_constant_op(op):
            for var in set(input_vars(op)):
                readers.setdefault(var, []).append(op)
    outputs = set(func.outputs)

    def sole_reader(var):
        found = readers.get(var, ())
        return found[0] if len(found) == 1 and var not in outputs else None

    fused = {}
    for op in func.operations:
        if op.op_type != "conv" or len(op.outputs) != 1:
            continue
        [out] = op.outputs
        if out in outputs:
            continue
        found = _relu(out, sole_reader) or (None if fp16 else (_hard_swish(out, readers.get(out, ()), sole_reader)
                                                               or _hard_sigmoid(out, sole_reader)))
        if found is not None:
            fused[op] = found
    return fused


def _relu(out, sole_reader) -> FusedActivation | None:
    reader = sole_reader(out)
    if reader is None or reader.op_type != "relu":
        return None
    return FusedActivation(Activation("relu"), (reader,), reader.outputs[0])


def _hard_swish(out, readers, sole_reader) -> FusedActivation | None:
    """``mul(out, sigmoid_hard(out))`` (either operand order), every value float32."""
    if len(readers) != 2:
        return None
    gate_op = next((op for op in readers if op.op_type == "sigmoid_hard"), None)
    if gate_op is None or gate_op.inputs.get("x") is not out:
        return None
    gate = gate_op.outputs[0]
    product_op = sole_reader(gate)
    if (product_op is None or product_op.op_type != "mul" or product_op not in readers
            or {id(product_op.inputs.get("x")), id(product_op.inputs.get("y"))} != {id(out), id(gate)}):
        return None
    product = product_op.outputs[0]
    constants = _gate_constants(gate_op)
    if constants is None or any(_declared_dtype(var) != np.float32 for var in (out, gate, product)):
        return None
    return FusedActivation(Activation("hard_swish", *constants), (gate_op, product_op), product)


def _hard_sigmoid(out, sole_reader) -> FusedActivation | None:
    """``sigmoid_hard(out)``, both float32: a squeeze-and-excite gate."""
    gate_op = sole_reader(out)
    if gate_op is None or gate_op.op_type != "sigmoid_hard":
        return None
    gate = gate_op.outputs[0]
    constants = _gate_constants(gate_op)
    if constants is None or any(_declared_dtype(var) != np.float32 for var in (out, gate)):
        return None
    return FusedActivation(Activation("hard_sigmoid", *constants), (gate_op,), gate)


def _gate_constants(gate_op) -> tuple[float, float] | None:
    """(alpha, beta) of a ``sigmoid_hard`` op (given or its defaults), or None if computed at run time."""
    if any(gate_op.inputs[name].val is None for name in ("alpha", "beta") if name in gate_op.inputs):
        return None
    constants = {name: var.val for name, var in gate_op.inputs.items()}
    alpha, beta = (scalar(param(gate_op, constants, name)) for name in ("alpha", "beta"))
    if alpha is None or beta is None or np.ndim(alpha) or np.ndim(beta):
        return None
    return float(alpha), float(beta)


def _declared_dtype(var):
    declared = tensor_type_of(var)
    return None if declared is None else declared[0]


def relu(value: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``max(value, 0)`` of a float array (NaN stays NaN, -0 may stay -0), into ``out`` if given.
    numpy's ``maximum`` branches on every element: on the mixed signs of a conv's output it ran
    2.5x slower than a ``clip`` to [0, inf), which is vectorised."""
    dtype = value.dtype.type
    return value.clip(dtype(0), dtype(np.inf), out=out)


def apply_in_place(activation: Activation, out: np.ndarray) -> np.ndarray:
    """``activation`` of ``out`` (a fresh float array: the conv's own result), written into it."""
    if activation.kind == "relu":
        return relu(out, out)
    dtype = out.dtype.type
    if activation.kind == "hard_sigmoid":
        out *= dtype(activation.alpha)
        out += dtype(activation.beta)
        return out.clip(dtype(0), dtype(1), out=out)
    gate = np.multiply(out, dtype(activation.alpha))
    gate += dtype(activation.beta)
    gate.clip(dtype(0), dtype(1), out=gate)
    out *= gate
    return out
