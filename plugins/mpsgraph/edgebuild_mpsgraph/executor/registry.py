"""The op vocabulary of the reference executor: MPSGraph op name -> numpy evaluator.

An evaluator takes the op's input arrays and its attributes and returns its outputs (a
list). Every op a lowering may emit must be here: the lowering runs the executor as it
emits, so an op without an evaluator cannot reach a program.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from edgebuild.plugin import OpTable

Evaluator = Callable[..., list[np.ndarray]]
# MPSGraph ops carry no opset: each op name holds one evaluator (a second one is an error naming both)
EVALUATORS = OpTable("an MPSGraph reference evaluator", hint="register each MPSGraph op once")


def evaluates(*names: str):
    def decorate(fn: Evaluator) -> Evaluator:
        for name in names:
            EVALUATORS.add(name, fn)
        return fn

    return decorate
