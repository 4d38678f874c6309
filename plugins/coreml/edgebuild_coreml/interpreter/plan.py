"""A MIL function prepared once for many runs: what every op reads, writes and releases.

Validation runs the same program on dozens of samples. Looking up evaluators, reading
declared types through coremltools, working out value liveness and conforming constants
cost as much per op as a small op's arithmetic, so a :class:`Plan` does it once per function
and each run only moves arrays.

Expanded constants (compressed weights after their ``constexpr_*`` op, fp16-rounded weights
under fp16 emulation) are kept for the plan's lifetime, which is the program's (the plans
are kept on the function), up to :data:`EXPANDED_CACHE_BYTES`; past that they are expanded
when read and dropped after their last reader, as on a single run.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np

from . import torch_kernels as kernels
from .registry import INPLACE

#: bytes of expanded constants a plan may keep between runs (a dense copy of a compressed
#: model's weights costs up to 16x its size on disk: the cap keeps large models bounded)
EXPANDED_CACHE_BYTES = 512 << 20
SMALL_CONSTANT_BYTES = 1024  # kept without counting

_PLANS_ATTRIBUTE = "_edgebuild_interpreter_plans"
_plans_lock = threading.Lock()
_NOT_COMPILED = object()


class _PlanSlot(dict):
    """{fp16 flag: Plan}, kept on the function it plans; a copied program starts without plans."""

    def __deepcopy__(self, memo):
        return _PlanSlot()

    def __copy__(self):
        return _PlanSlot()

    def __reduce__(self):
        return _PlanSlot, ()


def plan_for(func, *, fp16: bool) -> "Plan":
    """The plan of ``func`` (a pymil Function), built on first use and kept on ``func``.

    A graph pass may rewrite the program between runs (the fp16 guard runs it, then the fp16
    cast pass edits it): a plan remembers the operations it was made from and is rebuilt when
    they differ. :func:`forget_plans` drops them (and their cached weights) for good.
    """
    with _plans_lock:
        slot = getattr(func, _PLANS_ATTRIBUTE, None)
        if slot is None:
            slot = _PlanSlot()
            setattr(func, _PLANS_ATTRIBUTE, slot)
        plan = slot.get(fp16)
        if plan is None or not plan.matches(func):
            slot.clear()  # a stale plan's cached weights go with it
            plan = slot[fp16] = Plan(func, fp16=fp16)
        return plan


def forget_plans(prog) -> None:
    """Drop the plans of every function of ``prog``: before a pass rewrites it, so the plan's
    references do not keep replaced ops (and their weights) alive."""
    with _plans_lock:
        for func in prog.functions.values():
            if getattr(func, _PLANS_ATTRIBUTE, None) is not None:
                setattr(func, _PLANS_ATTRIBUTE, None)


#: op types whose evaluators compute fp16 operands in fp32: their fp16 constant inputs (weights)
#: are widened once per plan (see :meth:`Plan.widened`) instead of once per run
WIDENING_OPS = frozenset({"conv", "conv_transpose", "linear", "matmul", "einsum", "lstm", "gru", "rnn"})


class Step:
    """One op to evaluate: its evaluator, inputs, declared outputs and the values it releases."""

    __slots__ = ("op", "op_type", "inputs", "outputs", "release", "donors", "widens")

    def __init__(self, op, release: tuple, outputs: tuple | None = None):
        self.op = op
        self.op_type = op.op_type  # evaluators are looked up per run: a plugin may add one after the plan is made
        self.inputs = tuple((name, tuple(var) if isinstance(var, (list, tuple)) else var)
                            for name, var in op.inputs.items())
        # the Vars its results go to: the op's own, or those of the ops fused into it (see fusion)
        self.outputs = tuple((out, tensor_type_of(out), is_list_var(out)) for out in outputs or op.outputs)
        self.release = release
        self.widens = op.op_type in WIDENING_OPS
        # inputs an in-place evaluator may overwrite: read once here and by no later op
        self.donors: tuple = ()
        if op.op_type in INPLACE:
            single = [var for _, var in self.inputs if not isinstance(var, tuple)]
            self.donors = tuple((name, var) for name, var in self.inputs
                                if not isinstance(var, tuple) and var in release and single.count(var) == 1)


class Plan:
    """Steps of every block of a function, its constants and its expanded-weight cache."""

    def __init__(self, func, *, fp16: bool):
        self.fp16 = fp16
        self._operations = operations_of(func)
        self._release = last_readers(func)
        self._steps: dict = {}
        self._constants: dict = {}  # {Var: conformed value}, filled on first read
        self._cached_bytes = 0
        self._lock = threading.Lock()
        self._widened: dict = {}  # {Var: (its fp16 value, that value as fp32)}
        self._is_constant: dict = {}  # {Var: whether its value is a constant's}
        self._compiled: Any = _NOT_COMPILED  # see compiled_function
        self._inputs: tuple = ()  # see inputs_of

    def compiled_function(self, func, compile: Callable[[], Any]) -> Any:
        """``compile()``-d once for this plan (a CompiledFunction, or None when ``func`` does
        not compile): the ops are the plan's, so it lives as long as the plan."""
        compiled = self._compiled
        if compiled is _NOT_COMPILED:
            with self._lock:
                if self._compiled is _NOT_COMPILED:
                    self._compiled = compile()
                compiled = self._compiled
        return compiled

    def inputs_of(self, func) -> tuple:
        """``((name, Var, whether it is a state, its declared type, the type read), ...)`` of
        ``func``'s inputs, read through coremltools' types once while they are the same Vars of
        the same types: on a small net that reading cost a few percent of a sample, every call."""
        current = func.inputs
        entries = self._inputs
        if len(entries) == len(current) and all(
                entry[0] == name and entry[1] is var and entry[4] is var.sym_type
                for entry, (name, var) in zip(entries, current.items())):
            return entries
        from coremltools.converters.mil.mil import types

        entries = tuple((name, var, types.is_state(var.sym_type), tensor_type_of(var), var.sym_type)
                        for name, var in current.items())
        self._inputs = entries
        return entries

    def release_of(self, op) -> tuple:
        """The Vars no op after top-level ``op`` reads."""
        return tuple(self._release.get(op, ()))

    def matches(self, func) -> bool:
        return self._operations == operations_of(func)

    def steps(self, block) -> list[Step]:
        """The ops of ``block`` to evaluate, in order (constants and lazily expanded weights left out)."""
        steps = self._steps.get(block)
        if steps is None:
            steps = [Step(op, self.release_of(op))
                     for op in block.operations if not is_constant_op(op) and not decompresses(op)]
            self._steps[block] = steps
        return steps

    def cached(self, var) -> Any:
        """The cached value of constant ``var``, or None (also when the value it was made from
        was swapped since: compression's sensitivity analysis replaces a const's value in place)."""
        entry = self._constants.get(var)
        if entry is None:
            return None
        sources, objects, value = entry
        op = var.op
        if op is None or not decompresses(op):  # the common case, checked without building tuples
            holder = var._sym_val
            return value if holder is not None and holder.val is objects[0] else None
        return value if _source_ids(var)[0] == sources else None

    def constant(self, var, compute: Callable[[], Any]) -> Any:
        """The conformed value of constant ``var``: cached, or ``compute()``-d and cached if it fits."""
        value = self.cached(var)
        if value is not None:
            return value
        value = compute()
        size = _new_bytes(value, var)
        ids, sources = _source_ids(var)
        with self._lock:
            previous = self._constants.pop(var, None)
            if previous is not None:
                self._cached_bytes -= _new_bytes(previous[2], var)
            if self._cached_bytes + size <= EXPANDED_CACHE_BYTES:
                # the sources are kept with the entry, so their ids stay theirs while it lives
                self._constants[var] = (ids, sources, value)
                self._cached_bytes += size
        return value


    def widened(self, var, value) -> Any:
        """``value`` (fp16, ``var``'s) as fp32, kept while ``var``'s value stays the same object,
        when ``var`` is a constant (a weight); None for any other value."""
        entry = self._widened.get(var)
        if entry is not None and entry[0] is value:
            return entry[1]
        constant = self._is_constant.get(var)
        if constant is None:
            op = var.op
            constant = self._is_constant[var] = op is not None and (is_constant_op(op) or decompresses(op))
        if not constant:
            return None
        wide = kernels.cast(value, np.float32)
        with self._lock:
            previous = self._widened.pop(var, None)
            if previous is not None:
                self._cached_bytes -= previous[1].nbytes
            if self._cached_bytes + wide.nbytes <= EXPANDED_CACHE_BYTES:
                self._widened[var] = (value, wide)
                self._cached_bytes += wide.nbytes
        return wide


def _source_ids(var) -> tuple[tuple, tuple]:
    """(ids, objects) of the stored values ``var``'s constant value is made from: its own, or
    for an expanded weight those of its ``constexpr_*`` op's inputs."""
    op = var.op
    if op is not None and decompresses(op):
        ids, objects = [], []
        for inner in input_vars(op):
            inner_ids, inner_objects = _source_ids(inner)
            ids.extend(inner_ids)
            objects.extend(inner_objects)
        return tuple(ids), tuple(objects)
    holder = var._sym_val
    raw = None if holder is None else holder.val
    return (id(raw),), (raw,)


def _new_bytes(value, var) -> int:
    """Bytes ``value`` holds beyond the program's own copy of ``var``'s value (0 for a view of it,
    and for small values: op parameters, scalars)."""
    if not isinstance(value, np.ndarray) or value.nbytes <= SMALL_CONSTANT_BYTES:
        return 0
    known = var.val if var.op is None or not decompresses(var.op) else None
    if isinstance(known, np.ndarray) and np.shares_memory(value, known):
        return 0
    return value.nbytes


def operations_of(func) -> tuple:
    """What identifies ``func``'s operations in their order, to tell a plan is still its own.

    coremltools keeps a block's ops in a linked list, walked a node at a time in Python (a
    small net's validation spent a sample's time a call on it); its index {op: node} is a dict
    read at C speed. Every edit goes through that index, and an op inserted again (moved) gets a
    new node, so the same nodes in the same order mean the same program: the nodes are compared
    (held by the plan, so their ids stay theirs). Elsewhere the ops themselves are."""
    operations = func.operations
    index = getattr(operations, "op_to_node", None)
    if type(index) is dict:
        return tuple(index.values())
    return tuple(operations)


def is_constant_op(op) -> bool:
    return op.op_type == "const" or bool(op.outputs and all(out.val is not None for out in op.outputs))


def decompresses(op) -> bool:
    """Whether ``op`` expands a compressed weight (``constexpr_*``). Such ops usually stand
    together at the top of a program; evaluated in order, every weight of the model would be
    dense at once, so each is expanded when its reader runs and dropped after its last one
    (or kept in the plan's bounded cache)."""
    return op.op_type.startswith("constexpr_")


def input_vars(op):
    """The Vars ``op`` reads directly (list-valued inputs flattened)."""
    for var in op.inputs.values():
        yield from (var if isinstance(var, (list, tuple)) else (var,))


def _vars_read(op):
    """Vars ``op`` reads, including those read inside its nested blocks (cond, while_loop)."""
    yield from input_vars(op)
    for block in op.blocks:
        yield from block.outputs
        for inner in block.operations:
            yield from _vars_read(inner)


def last_readers(function) -> dict:
    """{top-level op: the Vars no later op reads}; the function's outputs are never dropped."""
    last_reader = {}
    for op in function.operations:
        for var in _vars_read(op):
            last_reader[var] = op
    outputs = set(function.outputs)
    dead_after: dict = {}
    for var, op in last_reader.items():
        if var not in outputs:
            dead_after.setdefault(op, []).append(var)
    return dead_after


def is_list_var(var) -> bool:
    from coremltools.converters.mil.mil import types

    return types.is_list(var.sym_type)


def tensor_type_of(var) -> tuple[np.dtype, tuple] | None:
    """(numpy dtype, shape) of a tensor/scalar Var; None for lists, strings, states."""
    from coremltools.converters.mil.mil import types

    sym_type = var.sym_type
    if types.is_state(sym_type):
        sym_type = sym_type.wrapped_type()
    if types.is_tensor(sym_type):
        primitive, shape = sym_type.get_primitive(), sym_type.get_shape()
    elif types.is_scalar(sym_type):
        primitive, shape = sym_type, ()
    else:
        return None
    if types.is_str(primitive):
        return None
    try:
        dtype = np.dtype(types.nptype_from_builtin(primitive))
    except (KeyError, TypeError):
        return None
    return dtype, tuple(shape)


def shape_matches(actual: tuple, declared: tuple) -> bool:
    """Declared symbolic dims match anything; static dims must be equal."""
    if len(actual) != len(declared):
        return False
    return all(
        not isinstance(d, (int, np.integer)) or int(d) == a for a, d in zip(actual, declared)
    )
