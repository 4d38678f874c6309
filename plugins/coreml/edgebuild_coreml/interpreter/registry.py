"""Op evaluators of the MIL interpreter, one per MIL op type.

An evaluator takes the op (a pymil ``Operation``) and its inputs already evaluated as a
dict {param name: numpy value, or a list of them for tuple params}, and returns one numpy
array per op output (a single array for single-output ops)::

    @evaluates("relu")
    def relu(op, x):
        return np.maximum(x["x"], 0)

An evaluator registered with ``inplace=True`` also takes ``donated``: the names of the inputs
whose arrays nobody else holds (read by no later op, no view of them alive), which it may
overwrite with its result instead of allocating one::

    @evaluates("relu", inplace=True)
    def relu(op, x, donated=()):
        v = x["x"]
        return np.maximum(v, 0, out=v if "x" in donated else None)
"""

from __future__ import annotations

from typing import Callable

from edgebuild.plugin import BuildError, OpTable

# MIL ops carry no opset: each op type holds one evaluator (a second one is an error naming both)
EVALUATORS = OpTable("a MIL interpreter evaluator", hint="register each MIL op type once")
INPLACE: set[str] = set()  # op types whose evaluator takes ``donated``


def evaluates(*op_types: str, inplace: bool = False):
    def decorate(fn: Callable) -> Callable:
        for op_type in op_types:
            EVALUATORS.add(op_type, fn)
            if inplace:
                INPLACE.add(op_type)
        return fn

    return decorate


def no_evaluator(op) -> BuildError:
    """The error for an op type no evaluator is registered for."""
    return BuildError(f"MIL interpreter has no evaluator for op type {op.op_type!r} (op {op.name!r})",
                      hint="add one with @evaluates in edgebuild_coreml.interpreter")


def evaluation_failed(op, exc: Exception) -> BuildError:
    """The error for an evaluator that raised: which op broke (the cause is chained by the caller)."""
    return BuildError(f"MIL interpreter failed on op {op.name!r} ({op.op_type}): {type(exc).__name__}: {exc}")
