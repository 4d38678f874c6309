"""Small read-only helpers over pymil ops and vars, shared by the rules, cost model and planner."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache, reduce

import numpy as np
from coremltools.converters.mil.mil import types
from coremltools.converters.mil.mil.ops.registry import SSAOpRegistry
from coremltools.converters.mil.mil.types.symbolic import is_symbolic


# coremltools answers "is this type a tensor" by formatting a description of the type, every
# time; a plan asks it several times per op. Types are classes made once per dtype and shape,
# so the answers are kept per type (a 22-layer decoder's plan: 2.7 s, of it 0.9 s asking).
@lru_cache(maxsize=8192)
def _is_tensor(sym_type) -> bool:
    return types.is_tensor(sym_type)


@lru_cache(maxsize=8192)
def _is_tensor_like(sym_type) -> bool:
    return types.is_tensor(sym_type) or (types.is_scalar(sym_type) and not types.is_str(sym_type))


@lru_cache(maxsize=8192)
def _dtype_name(sym_type) -> str:
    """What ``builtin_to_string(var.dtype)`` says, by ``Var.dtype``'s own reading of the type."""
    if types.is_tensor(sym_type):
        return types.builtin_to_string(sym_type.get_primitive())
    if types.is_state(sym_type):
        return types.builtin_to_string(sym_type.wrapped_type().get_primitive())
    return types.builtin_to_string(sym_type)


def is_tensor_like(var) -> bool:
    """True for tensors and scalars (not lists, tuples or strings)."""
    return _is_tensor_like(var.sym_type)


def dtype_name(var) -> str:
    """``fp16``, ``fp32``, ``int32``, ``bool`` ... for a tensor or scalar var."""
    return _dtype_name(var.sym_type)


def is_constant(var) -> bool:
    """A var whose value is known at build time (const or constexpr output)."""
    return var.val is not None or (var.op is not None and var.op.op_type.startswith("constexpr_"))


def input_vars(op) -> Iterator[tuple[str, object]]:
    """(input name, var) for every input var, flattening tuple inputs such as concat's values."""
    for name, value in op.inputs.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        for var in values:
            yield name, var


def data_inputs(op) -> list:
    """Non-constant tensor inputs: the activations the op reads at run time."""
    remembered = getattr(_READ_ONCE, "inputs", None)
    if remembered is None:
        return _data_inputs(op)
    known = remembered.get(id(op))  # within inputs_read_once: asked by several rules per op
    if known is None or known[0] is not op:
        known = remembered[id(op)] = (op, _data_inputs(op))
    return list(known[1])


def _data_inputs(op) -> list:
    return [var for _, var in input_vars(op) if is_tensor_like(var) and not is_constant(var)]


_READ_ONCE = threading.local()


@contextmanager
def inputs_read_once():
    """Within (on this thread): each op's ``data_inputs`` are worked out once and then remembered,
    for a reader that does not change the program meanwhile (a plan asks for them from five rules,
    the cost model and the edges between nodes: 8 times per op)."""
    outer = getattr(_READ_ONCE, "inputs", None)
    _READ_ONCE.inputs = {} if outer is None else outer
    try:
        yield
    finally:
        _READ_ONCE.inputs = outer


def tensor_outputs(op) -> list:
    return [var for var in op.outputs if is_tensor_like(var)]


def shape_of(var) -> tuple:
    sym_type = var.sym_type
    return tuple(sym_type.get_shape()) if _is_tensor(sym_type) else ()


def static_numel(var, symbolic_default: int = 1) -> int:
    """Element count, counting each symbolic dimension as ``symbolic_default``."""
    dims = [symbolic_default if is_symbolic(d) else int(d) for d in shape_of(var)]
    return reduce(lambda a, b: a * b, dims, 1)


def itemsize(var) -> int:
    """Bytes per element; bool and int8 count one byte."""
    return _itemsize(dtype_name(var))


@lru_cache(maxsize=256)
def _itemsize(name: str) -> int:
    digits = "".join(ch for ch in name if ch.isdigit())
    return max(1, int(digits) // 8) if digits else 1


def nbytes(var) -> int:
    return static_numel(var) * itemsize(var)


def param(op, name: str, default=None):
    """The compile-time value of input ``name`` (a numpy value or python scalar), or ``default``."""
    var = op.inputs.get(name)
    if var is None or isinstance(var, (list, tuple)) or var.val is None:
        return default
    value = var.val
    return value.tolist() if isinstance(value, np.ndarray) else value


def symbols_in(var) -> set:
    """Free sympy symbols appearing in the var's shape."""
    found = set()
    for dim in shape_of(var):
        if is_symbolic(dim):
            found |= set(getattr(dim, "free_symbols", {dim}))
    return found


def is_custom_op(op) -> bool:
    return op.op_type in SSAOpRegistry.custom_ops or hasattr(op, "bindings")


def main_function(prog, function_name: str = "main"):
    if function_name in prog.functions:
        return prog.functions[function_name]
    return next(iter(prog.functions.values()))


def is_symbolic_dim(dim) -> bool:
    return is_symbolic(dim)
