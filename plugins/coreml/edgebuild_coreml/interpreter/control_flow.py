"""Ops that need the interpreter, not just values: cond and while_loop run nested blocks,
coreml_update_state writes a state in place.

Each takes ``(op, args, interpreter, env)`` where ``args`` are the op's evaluated inputs and
returns the op's output values.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from edgebuild.plugin import BuildError

# A runaway loop should fail the build, not hang it.
MAX_LOOP_ITERATIONS = 10_000_000


def _cond(op, args, interpreter, env):
    branch = op.blocks[0] if bool(np.asarray(args["pred"])) else op.blocks[1]
    return tuple(interpreter.run_block(branch, env))


def _while_loop(op, args, interpreter, env):
    cond_block, body_block = op.blocks
    loop_vars = list(args["loop_vars"])
    for _ in range(MAX_LOOP_ITERATIONS):
        (keep_going,) = interpreter.run_block(cond_block, env, loop_vars)
        if not bool(np.asarray(keep_going)):
            return tuple(loop_vars)
        loop_vars = interpreter.run_block(body_block, env, loop_vars)
    raise BuildError(
        f"MIL interpreter: while_loop {op.name!r} did not finish in "
        f"{MAX_LOOP_ITERATIONS} iterations"
    )


def _read_state(op, args, interpreter, env):
    # a copy, as Core ML's read_state: no later op may write into the state through it
    return np.array(args["input"], copy=True)


def _update_state(op, args, interpreter, env):
    state = op.inputs["state"]
    env[state] = args["value"]
    interpreter.states_written[state.name] = args["value"]  # kept for the caller across calls
    return args["value"]


BLOCK_EVALUATORS: dict[str, Callable] = {
    "cond": _cond,
    "while_loop": _while_loop,
    "read_state": _read_state,
    "coreml_update_state": _update_state,
}
