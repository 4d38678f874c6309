"""Run a pymil Program op by op with numpy: the reference executor for ML Programs.

Every op output is cast to the dtype its Var declares, so an fp16-typed program computes
with fp16 intermediates the way Core ML runs it; ``fp16=True`` additionally rounds every
fp32 intermediate through fp16 to emulate a float16 compute precision on an fp32 program.
"""

from __future__ import annotations

import os
import sys
import weakref
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from edgebuild.plugin import BuildError, EdgebuildError

from . import torch_kernels as kernels
from ._scratch import lease as scratch_lease
from .half_rounding import round_to_half
from .compiled import CompiledFunction
from .control_flow import BLOCK_EVALUATORS
from .loading import load_evaluators
from .plan import (
    Plan,
    Step,
    decompresses,
    input_vars,
    plan_for,
    shape_matches,
    tensor_type_of,
)
from .registry import EVALUATORS, INPLACE, evaluation_failed, no_evaluator

__all__ = ["input_vars", "load_mlpackage", "run_mlpackage", "run_program", "run_program_samples"]

_WEIGHTS_SUBDIR = os.path.join("Data", "com.apple.CoreML", "weights")


def run_program(
    prog,
    inputs: Mapping[str, np.ndarray],
    *,
    fp16: bool = False,
    function: str = "main",
    observer: Callable[[Any, list], None] | None = None,
    states: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Evaluate ``prog.functions[function]`` on ``inputs``; returns {output name: array}.

    ``states``: {state name: array} of a stateful program (Core ML states, iOS18), read by its
    ``read_state`` ops and updated in place with what its ``coreml_update_state`` ops wrote, so a
    caller keeps them across calls; a state not in it starts as zeros (Core ML's ``make_state``).

    ``observer(op, outputs)`` is called after every evaluated (non-constant) op with its output
    values, e.g. to record activation ranges; a list it returns replaces those values for the ops
    that read them.

    Each value is dropped after the last op that reads it: holding every activation of a
    full-resolution conv net at once would cost several times its weights. The program's plan
    (see :class:`Plan`) is worked out on the first call and reused while the program is unchanged,
    so validating many samples pays for it, and for expanding compressed weights, once.
    """
    func = _function(prog, function)
    plan = plan_for(func, fp16=fp16)
    interpreter = _Interpreter(plan, observer=observer)
    env = interpreter.bind_function_inputs(func, inputs, states)
    outputs = None
    with scratch_lease():
        if observer is None:  # the observer sees every op on the generic loop
            compiled = plan.compiled_function(func, lambda: _compile(plan, func))
            if compiled is not None:
                outputs = compiled.run(env)  # None: a constant past the cache's cap, run generically
        if outputs is None:
            outputs = interpreter.run_block(func, env)
    if states is not None:
        states.update(interpreter.states_written)
    return {var.name: value for var, value in zip(func.outputs, outputs)}


def run_program_samples(prog, samples: list[Mapping[str, np.ndarray]], *, fp16: bool = False,
                        function: str = "main") -> list[dict[str, np.ndarray]]:
    """``[run_program(prog, sample, fp16=fp16) for sample in samples]``, with each op run on every
    sample before the next where the function compiles (``CompiledFunction.run_many``): several
    samples of a small net at once run faster than one after another."""
    func = _function(prog, function)
    plan = plan_for(func, fp16=fp16)
    envs = [_Interpreter(plan).bind_function_inputs(func, sample) for sample in samples]
    with scratch_lease():
        compiled = plan.compiled_function(func, lambda: _compile(plan, func))
        outputs = None if compiled is None else compiled.run_many(envs)
        if outputs is None:  # not compiled, or a constant past the cache's cap
            outputs = [_Interpreter(plan).run_block(func, env) for env in envs]
    return [{var.name: value for var, value in zip(func.outputs, values)} for values in outputs]


def _function(prog, name: str):
    load_evaluators()
    if name not in prog.functions:
        raise BuildError(
            f"MIL program has no function {name!r}",
            hint=f"available functions: {', '.join(sorted(prog.functions))}",
        )
    return prog.functions[name]


def _compile(plan: Plan, func) -> CompiledFunction | None:
    if not CompiledFunction.eligible(func):
        return None
    fp16 = plan.fp16
    planned = weakref.proxy(plan)  # the plan holds the compiled function: no cycle through it
    return CompiledFunction(plan, func, lambda var, declared, value: _conform(var, declared, value, fp16),
                            lambda var: _Interpreter(planned).value_of(var, {}))


def load_mlpackage(path: str | os.PathLike):
    """Read an ``.mlpackage`` (or ``.mlmodel``) ML Program back into a pymil Program."""
    import coremltools as ct
    from coremltools.converters.mil.frontend.milproto.load import load as load_milproto

    path = Path(path)
    if not path.exists():
        raise BuildError(f"{path}: no such model package")
    try:
        spec = ct.utils.load_spec(str(path))
    except Exception as exc:  # noqa: BLE001 - coremltools raises assorted types here
        raise BuildError(f"{path}: cannot read the Core ML model spec: {exc}") from exc
    if spec.WhichOneof("Type") != "mlProgram":
        raise BuildError(
            f"{path}: is a {spec.WhichOneof('Type')} model, not an ML Program",
            hint="only mlprogram models can be interpreted; convert with convert_to='mlprogram'",
        )
    weights_dir = path / _WEIGHTS_SUBDIR if path.is_dir() else path.parent / "weights"
    return load_milproto(spec, spec.specificationVersion, str(weights_dir))


def run_mlpackage(
    path: str | os.PathLike, inputs: Mapping[str, np.ndarray], *, fp16: bool = False
) -> dict[str, np.ndarray]:
    """Load ``path`` and run its ``main`` function on ``inputs``."""
    return run_program(load_mlpackage(path), inputs, fp16=fp16)


class _Interpreter:
    """Evaluates blocks against an environment {Var: value}; nested blocks share it."""

    def __init__(self, plan: Plan, *, observer: Callable[[Any, list], None] | None = None):
        self.plan = plan
        self.fp16 = plan.fp16
        self.observer = observer
        self.states_written: dict[str, np.ndarray] = {}  # state name -> its last coreml_update_state value

    # -- inputs ---------------------------------------------------------------------------

    def bind_function_inputs(self, func, inputs: Mapping[str, np.ndarray], states: Mapping | None = None) -> dict:
        declared_inputs = self.plan.inputs_of(func)
        missing = [name for name, _, is_state, _, _ in declared_inputs if name not in inputs and not is_state]
        if missing:
            raise BuildError(
                f"MIL program input(s) {', '.join(map(repr, missing))} not given",
                hint=f"the program expects: {', '.join(map(repr, func.inputs))}",
            )
        env: dict = {}
        for name, var, is_state, _, _ in declared_inputs:
            if is_state:
                given = (states or {}).get(name)
                env[var] = _state_value(var, inputs.get(name) if given is None else given)
        for name, var, is_state, declared, _ in declared_inputs:
            if is_state:
                continue
            value = np.asarray(inputs[name])
            if declared is not None:
                dtype, shape = declared
                if not shape_matches(value.shape, shape):
                    raise BuildError(
                        f"MIL program input {name!r} has shape {value.shape}, "
                        f"expected {tuple(shape)}"
                    )
                value = value if value.dtype == dtype else kernels.cast(value, dtype)
                if self.fp16 and dtype == np.float32:
                    value = round_to_half(value)
            env[var] = value
        return env

    # -- blocks ---------------------------------------------------------------------------

    def run_block(self, block, env: dict, block_inputs: list | None = None) -> list:
        """Run ``block`` with its inputs bound to ``block_inputs``; returns its outputs."""
        if block_inputs is not None:
            for var, value in zip(block.inputs, block_inputs):
                env[var] = value
        for step in self.plan.steps(block):
            self._evaluate(step, env)
        return [self.value_of(var, env) for var in block.outputs]

    def value_of(self, var, env: dict) -> Any:
        value = env.get(var, _MISSING)
        if value is not _MISSING:
            return value
        value = self.plan.cached(var)
        if value is not None:
            env[var] = value
            return value
        op = var.op
        if op is not None and decompresses(op):  # expanded when first read, see plan.decompresses
            value = self.plan.constant(var, lambda: self._expand(op, env, var))
        elif var.val is not None:
            value = self.plan.constant(var, lambda: self._conform(var, tensor_type_of(var), var.val))
        else:
            producer = op.name if op is not None else "a block input"
            raise BuildError(
                f"MIL interpreter: value of {var.name!r} (from {producer}) is not available",
                hint="the program reads a variable before it is computed",
            )
        env[var] = value  # released with the var after its last reader
        return value

    def _expand(self, op, env: dict, var) -> Any:
        self._evaluate(Step(op, ()), env)
        return env[var]

    # -- ops ------------------------------------------------------------------------------

    def _evaluate(self, step: Step, env: dict) -> None:
        op = step.op
        try:
            args, donated = self._gather_inputs(step, env)
            evaluator = EVALUATORS.get(step.op_type)
            if step.op_type in BLOCK_EVALUATORS:
                results = BLOCK_EVALUATORS[step.op_type](op, args, self, env)
            elif evaluator is None:
                raise no_evaluator(op)
            elif step.donors and step.op_type in INPLACE:
                results = evaluator(op, args, donated=donated)
            else:
                results = evaluator(op, args)
        except EdgebuildError:
            raise
        except Exception as exc:  # noqa: BLE001 - report which op broke, keep the cause
            raise evaluation_failed(op, exc) from exc
        outputs = step.outputs
        if len(outputs) == 1 and (outputs[0][2] or not isinstance(results, (tuple, list))):
            results = (results,)
        if len(results) != len(outputs):
            raise BuildError(
                f"MIL interpreter: evaluator for {op.op_type!r} returned {len(results)} "
                f"values, op {op.name!r} has {len(outputs)} outputs"
            )
        for (out, declared, _), value in zip(outputs, results):
            env[out] = self._conform(out, declared, value, op=op)
        if self.observer is not None:
            replaced = self.observer(op, [env[out] for out, _, _ in outputs])
            if replaced is not None:  # e.g. the fp16 guard rounding an op's outputs as fp16 would
                for (out, _, _), value in zip(outputs, replaced):
                    env[out] = value
        for var in step.release:
            env.pop(var, None)

    def _gather_inputs(self, step: Step, env: dict) -> tuple[dict, frozenset]:
        donated = set()
        for name, var in step.donors:
            value = env.pop(var, _MISSING)  # it is released after this op anyway
            if value is not _MISSING:
                # Free to overwrite when it owns its memory and only this frame holds it: any
                # live view of it, or another name for it, would hold a reference.
                if sys.getrefcount(value) == 2 and _owns_writable_memory(value):
                    donated.add(name)
                env[var] = value
        args = {}
        for name, var in step.inputs:
            if isinstance(var, tuple):
                args[name] = [self.value_of(v, env) for v in var]
            else:
                value = args[name] = self.value_of(var, env)
                if step.widens and getattr(value, "dtype", None) == np.float16:
                    wide = self.plan.widened(var, value)
                    if wide is not None:
                        args[name] = wide
        return args, frozenset(donated)

    def _conform(self, var, declared, value, op=None):
        return _conform(var, declared, value, self.fp16, op)


_MISSING = object()


def _conform(var, declared, value, fp16: bool, op=None):
    """Cast ``value`` to ``var``'s declared dtype (and fp16-round if emulating); an op's output
    (``op`` given) must have the declared shape."""
    if declared is None:
        return value
    dtype, shape = declared
    array = value if isinstance(value, np.ndarray) else np.asarray(value)
    if op is not None and not shape_matches(array.shape, shape):
        raise BuildError(
            f"MIL interpreter: op {op.name!r} ({op.op_type}) produced shape "
            f"{array.shape} for {var.name!r}, which is declared {tuple(shape)}"
        )
    if array.dtype != dtype:
        array = kernels.cast(array, dtype)
    if fp16 and dtype == np.float32:
        array = round_to_half(array)
    return array


def _state_value(var, given) -> np.ndarray:
    """A state's value: the caller's (checked against the declared shape and dtype) or zeros."""
    from coremltools.converters.mil.mil import types

    wrapped = var.sym_type.wrapped_type()
    dtype = types.nptype_from_builtin(wrapped.get_primitive())
    shape = tuple(int(d) for d in wrapped.get_shape())
    if given is None:
        return np.zeros(shape, dtype)
    value = np.asarray(given)
    if value.shape != shape:
        raise BuildError(f"MIL program state {var.name!r} has shape {value.shape}, expected {shape}")
    return value.astype(dtype, copy=False)


def _owns_writable_memory(value) -> bool:
    return isinstance(value, np.ndarray) and value.base is None and value.flags.writeable
