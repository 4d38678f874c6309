"""Run a pymil Program op by op with numpy: the reference executor for ML Programs.

Every op output is cast to the dtype its Var declares, so an fp16-typed program computes
with fp16 intermediates the way Core ML runs it; ``fp16=True`` additionally rounds every
fp32 intermediate through fp16 to emulate a float16 compute precision on an fp32 program.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from edgebuild.errors import BuildError, EdgebuildError

from .control_flow import BLOCK_EVALUATORS
from .loading import load_evaluators
from .registry import EVALUATORS

_WEIGHTS_SUBDIR = os.path.join("Data", "com.apple.CoreML", "weights")


def run_program(
    prog,
    inputs: Mapping[str, np.ndarray],
    *,
    fp16: bool = False,
    function: str = "main",
    observer: Callable[[Any, list], None] | None = None,
) -> dict[str, np.ndarray]:
    """Evaluate ``prog.functions[function]`` on ``inputs``; returns {output name: array}.

    ``observer(op, outputs)`` is called after every evaluated (non-constant) op with its output
    values, e.g. to record activation ranges.

    Each value is dropped after the last op that reads it: holding every activation of a
    full-resolution conv net at once would cost several times its weights.
    """
    load_evaluators()
    if function not in prog.functions:
        raise BuildError(
            f"MIL program has no function {function!r}",
            hint=f"available functions: {', '.join(sorted(prog.functions))}",
        )
    func = prog.functions[function]
    interpreter = _Interpreter(fp16=fp16, observer=observer, release_after=_last_readers(func))
    env = interpreter.bind_function_inputs(func, inputs)
    outputs = interpreter.run_block(func, env)
    return {var.name: value for var, value in zip(func.outputs, outputs)}


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


def _decompresses(op) -> bool:
    """Whether ``op`` expands a compressed weight (``constexpr_*``). Such ops usually stand
    together at the top of a program; evaluated in order, every weight of the model would be
    dense at once, so each is expanded when its reader runs and dropped after its last one."""
    return op.op_type.startswith("constexpr_")


def _last_readers(function) -> dict:
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


class _Interpreter:
    """Evaluates blocks against an environment {Var: value}; nested blocks share it."""

    def __init__(self, *, fp16: bool, observer: Callable[[Any, list], None] | None = None,
                 release_after: dict | None = None):
        self.fp16 = fp16
        self.observer = observer
        self.release_after = release_after or {}  # {op: Vars to drop once it has run}

    # -- inputs ---------------------------------------------------------------------------

    def bind_function_inputs(self, func, inputs: Mapping[str, np.ndarray]) -> dict:
        missing = [name for name in func.inputs if name not in inputs]
        if missing:
            raise BuildError(
                f"MIL program input(s) {', '.join(map(repr, missing))} not given",
                hint=f"the program expects: {', '.join(map(repr, func.inputs))}",
            )
        env: dict = {}
        for name, var in func.inputs.items():
            value = np.asarray(inputs[name])
            declared = _tensor_type_of(var)
            if declared is not None:
                dtype, shape = declared
                if not _shape_matches(value.shape, shape):
                    raise BuildError(
                        f"MIL program input {name!r} has shape {value.shape}, "
                        f"expected {tuple(shape)}"
                    )
                value = value.astype(dtype, copy=False)
                if self.fp16 and dtype == np.float32:
                    value = value.astype(np.float16).astype(np.float32)
            env[var] = value
        return env

    # -- blocks ---------------------------------------------------------------------------

    def run_block(self, block, env: dict, block_inputs: list | None = None) -> list:
        """Run ``block`` with its inputs bound to ``block_inputs``; returns its outputs."""
        if block_inputs is not None:
            for var, value in zip(block.inputs, block_inputs):
                env[var] = value
        for op in block.operations:
            if not _decompresses(op):  # evaluated when first read, see value_of
                self._evaluate_op(op, env)
        return [self.value_of(var, env) for var in block.outputs]

    def value_of(self, var, env: dict) -> Any:
        if var in env:
            return env[var]
        if var.op is not None and _decompresses(var.op):
            self._evaluate_op(var.op, env)
            return env[var]
        known = var.val
        if known is None:
            producer = var.op.name if var.op is not None else "a block input"
            raise BuildError(
                f"MIL interpreter: value of {var.name!r} (from {producer}) is not available",
                hint="the program reads a variable before it is computed",
            )
        value = self._conform(var, known)
        env[var] = value
        return value

    # -- ops ------------------------------------------------------------------------------

    def _evaluate_op(self, op, env: dict) -> None:
        if op.op_type == "const" or (op.outputs and all(out.val is not None for out in op.outputs)):
            for out in op.outputs:
                env[out] = self._conform(out, out.val)
            return
        try:
            if op.op_type in BLOCK_EVALUATORS:
                args = self._gather_inputs(op, env)
                results = BLOCK_EVALUATORS[op.op_type](op, args, self, env)
            else:
                evaluator = EVALUATORS.get(op.op_type)
                if evaluator is None:
                    raise BuildError(
                        f"MIL interpreter has no evaluator for op type {op.op_type!r} "
                        f"(op {op.name!r})",
                        hint="add one with @evaluates in edgebuild_coreml.interpreter",
                    )
                results = evaluator(op, self._gather_inputs(op, env))
        except EdgebuildError:
            raise
        except Exception as exc:  # noqa: BLE001 - report which op broke, keep the cause
            raise BuildError(
                f"MIL interpreter failed on op {op.name!r} ({op.op_type}): "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if len(op.outputs) == 1 and not isinstance(results, (tuple, list)):
            results = (results,)
        elif len(op.outputs) == 1 and _is_list_var(op.outputs[0]):
            results = (results,)
        if len(results) != len(op.outputs):
            raise BuildError(
                f"MIL interpreter: evaluator for {op.op_type!r} returned {len(results)} "
                f"values, op {op.name!r} has {len(op.outputs)} outputs"
            )
        for out, value in zip(op.outputs, results):
            env[out] = self._conform(out, value, op=op)
        if self.observer is not None:
            self.observer(op, [env[out] for out in op.outputs])
        for var in self.release_after.get(op, ()):
            env.pop(var, None)

    def _gather_inputs(self, op, env: dict) -> dict:
        args = {}
        for name, var in op.inputs.items():
            if isinstance(var, (list, tuple)):
                args[name] = [self.value_of(v, env) for v in var]
            else:
                args[name] = self.value_of(var, env)
        return args

    def _conform(self, var, value, op=None):
        """Cast ``value`` to ``var``'s declared dtype (and fp16-round if emulating)."""
        declared = _tensor_type_of(var)
        if declared is None:
            return value
        dtype, shape = declared
        array = np.asarray(value)
        if op is not None and not _shape_matches(array.shape, shape):
            raise BuildError(
                f"MIL interpreter: op {op.name!r} ({op.op_type}) produced shape "
                f"{array.shape} for {var.name!r}, which is declared {tuple(shape)}"
            )
        array = array.astype(dtype, copy=False)
        if self.fp16 and dtype == np.float32:
            array = array.astype(np.float16).astype(np.float32)
        return array


def _is_list_var(var) -> bool:
    from coremltools.converters.mil.mil import types

    return types.is_list(var.sym_type)


def _tensor_type_of(var) -> tuple[np.dtype, tuple] | None:
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


def _shape_matches(actual: tuple, declared: tuple) -> bool:
    """Declared symbolic dims match anything; static dims must be equal."""
    if len(actual) != len(declared):
        return False
    return all(
        not isinstance(d, (int, np.integer)) or int(d) == a for a, d in zip(actual, declared)
    )
