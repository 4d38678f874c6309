"""Op evaluators of the MIL interpreter, one per MIL op type.

An evaluator takes the op (a pymil ``Operation``) and its inputs already evaluated as a
dict {param name: numpy value, or a list of them for tuple params}, and returns one numpy
array per op output (a single array for single-output ops)::

    @evaluates("relu")
    def relu(op, x):
        return np.maximum(x["x"], 0)
"""

from __future__ import annotations

from typing import Callable

EVALUATORS: dict[str, Callable] = {}


def evaluates(*op_types: str):
    def decorate(fn: Callable) -> Callable:
        for op_type in op_types:
            EVALUATORS[op_type] = fn
        return fn

    return decorate
