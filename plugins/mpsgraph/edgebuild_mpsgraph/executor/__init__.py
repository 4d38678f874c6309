"""The numpy reference executor of serialized MPSGraph programs: one evaluator per op name."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np

from edgebuild.plugin import BuildError
from edgebuild_mpsgraph.executor import elementwise, nn, tensor  # noqa: F401  (they register evaluators)
from edgebuild_mpsgraph.executor.registry import EVALUATORS
from edgebuild_mpsgraph.program import Op, Program, load_program


def evaluate_op(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    evaluator = EVALUATORS.get(op.op)
    if evaluator is None:
        raise BuildError(f"MPSGraph op {op.op!r} (from {op.name or 'an unnamed node'}) has no reference evaluator",
                         hint=f"known ops: {', '.join(EVALUATORS.op_types())}")
    return evaluator(*inputs, **op.attrs)


def run_program(program: Program | str | Path, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run ``program`` (or a program directory) on ``inputs``; returns its outputs by name."""
    if not isinstance(program, Program):
        program = load_program(Path(program))
    values: dict[str, np.ndarray] = dict(program.constants)
    for name in program.inputs:
        if name not in inputs:
            raise BuildError(f"MPSGraph program input {name!r} was not given",
                             hint=f"the program takes: {', '.join(program.inputs)}")
        dtype, shape = program.tensors[name]
        values[name] = np.asarray(inputs[name]).astype(dtype, copy=False).reshape(shape)
    for op in program.ops:
        results = evaluate_op(op, [values[i] if i else None for i in op.inputs])
        values.update(zip(op.outputs, results))
    return {name: values[name] for name in program.outputs}
