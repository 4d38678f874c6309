"""The compute plan of a flexible-shape program at each of its enumerated shapes.

A decoder built for query lengths 1 and 64 is two programs for the Neural Engine: Core ML
compiles each enumerated shape on its own, and what fits the ANE at one length (a one-token
cache write) may not at another. ``plan_per_shape`` fixes the input shapes one choice at a time
(``retyped``: the types of the ops that depend on them inferred again in place; coremltools'
own ``materialize_symbolic_shape_program`` pass, ``specialise``, for a program with control
flow), plans each, and returns one summary row per choice.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from contextlib import contextmanager

from edgebuild.plugin import BuildError
from edgebuild_coreml.ane import mil_view
from edgebuild_coreml.ane.plan import Plan, plan_program

_SCRATCH_FUNCTION = "edgebuild_fixed_shapes"
# A stateful decoder's token input (the artifact contract): its varying dim is the query length.
QUERY_INPUT = "input_ids"


@contextmanager
def _quiet_coremltools():
    """The pass warns for every input left flexible; a copy leaves them all so on purpose."""
    log = logging.getLogger("coremltools")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _check_named_inputs(function, shapes: Mapping[str, Sequence[int]]) -> None:
    unknown = sorted(set(shapes) - set(function.inputs))
    if unknown:
        raise BuildError(f"compute plan: no program input named {', '.join(unknown)}",
                         hint=f"the program's inputs are: {', '.join(function.inputs)}")


def specialise(prog, shapes: Mapping[str, Sequence[int]]):
    """A new Program whose main function is ``prog``'s main with ``shapes`` for the named inputs
    (``{}``: an unchanged copy, e.g. to rewrite without touching ``prog``).

    ``prog`` is left as it was (the pass names the constants it copies; those names are undone).
    """
    from coremltools.converters.mil.mil import Program
    from coremltools.converters.mil.mil.passes.defs.symbol_transform import (
        materialize_symbolic_shape_program,
    )

    function = mil_view.main_function(prog)
    _check_named_inputs(function, shapes)
    consts = [op for op in function.operations if op.op_type == "const"]
    weight_ids = [op.weight_id for op in consts]
    materialize = materialize_symbolic_shape_program()
    materialize.function_name_to_materialization_map = {
        _SCRATCH_FUNCTION: {name: tuple(int(d) for d in shape) for name, shape in shapes.items()}}
    source = "main" if "main" in prog.functions else next(iter(prog.functions))
    materialize.source_function_name = source
    try:
        with _quiet_coremltools():
            materialize.apply(prog)
        fixed = prog.functions.pop(_SCRATCH_FUNCTION)
    finally:
        prog.functions.pop(_SCRATCH_FUNCTION, None)
        for op, weight_id in zip(consts, weight_ids):
            op._weight_id = weight_id  # the setter refuses None, and a second value
    specialised = Program()
    specialised.add_function("main", fixed)
    return specialised


@contextmanager
def retyped(prog, shapes: Mapping[str, Sequence[int]]):
    """Within: ``prog`` itself with ``shapes`` for the named inputs, the output types and values of
    every op that depends on them inferred again, in place; every type and value as it was on the
    way out. What ``specialise`` gives a plan, without copying the program: coremltools'
    materialisation rebuilds every op, constants included (a 22-layer decoder: 1.2 s a shape).

    Raises NotImplementedError for a program with nested blocks (control flow); use ``specialise``.
    """
    from coremltools.converters.mil.mil import types

    function = mil_view.main_function(prog)
    _check_named_inputs(function, shapes)
    ops = list(function.operations)
    if any(op.blocks for op in ops):
        raise NotImplementedError("nested blocks")
    changed = {id(function.inputs[name]) for name in shapes}
    saved = [(function.inputs[name], function.inputs[name]._sym_type, function.inputs[name]._sym_val)
             for name in shapes]
    try:
        for name, shape in shapes.items():
            var = function.inputs[name]
            var._sym_type = types.tensor(var.dtype, tuple(int(d) for d in shape))
        with function:  # some ops' inference reads the opset of the block they are in
            for op in ops:
                if not any(id(var) in changed for _, var in mil_view.input_vars(op)):
                    continue  # its types do not depend on the shapes
                saved.extend((var, var._sym_type, var._sym_val) for var in op.outputs)
                op.type_value_inference(overwrite_output=True)
                changed.update(id(var) for var in op.outputs)
        yield prog
    finally:
        for var, sym_type, sym_val in reversed(saved):
            var._sym_type, var._sym_val = sym_type, sym_val


def summary(plan: Plan) -> dict:
    """Ops and estimated time per unit, and the Neural Engine's share of each."""
    ops = [op for op in plan.ops if not op.fused_into]  # fused ops count with their host
    total_ms = plan.total_ms
    ane = [op for op in ops if op.unit == "ane"]
    ane_ms = sum(op.est_ms for op in ane)
    return {
        "ops": len(ops),
        "ane_ops": len(ane),
        "ane_op_share": round(100.0 * len(ane) / len(ops), 1) if ops else 0.0,
        "ane_ms": round(ane_ms, 6),
        "total_ms": round(total_ms, 6),
        "ane_time_share": round(100.0 * ane_ms / total_ms, 1) if total_ms else 0.0,
        "breakdown": plan.breakdown(),
    }


def _varying_dim(choices: Sequence[Mapping[str, Sequence[int]]]) -> tuple[str, int] | None:
    """(input, axis) when the choices differ in exactly one dimension of one input: the query length."""
    varying = {(name, axis) for name in choices[0] for axis in range(len(choices[0][name]))
               if len({tuple(c[name])[axis] for c in choices}) > 1}
    return next(iter(varying)) if len(varying) == 1 else None


def _plan_fixed(prog, shapes: Mapping[str, Sequence[int]], plan_kwargs: dict) -> Plan:
    """The plan of ``prog`` with ``shapes``: retyped in place, or a materialised copy when the
    program has control flow."""
    try:
        with retyped(prog, shapes) as fixed:
            return plan_program(fixed, **plan_kwargs)
    except NotImplementedError:
        return plan_program(specialise(prog, shapes), **plan_kwargs)


def plan_per_shape(prog, choices: Sequence[Mapping[str, Sequence[int]]], *, query_input: str = QUERY_INPUT,
                   **plan_kwargs) -> list[dict]:
    """One row per shape choice ({input: shape}): the shapes, the dim that varies (when one does:
    ``varying``, and ``query_length`` when it is ``query_input``'s) and ``summary`` of the plan of
    the program fixed to those shapes."""
    if not choices:
        return []
    varying = _varying_dim(choices)
    plan_kwargs = {**plan_kwargs, "shapes_dynamic": set()}  # every shape is fixed now
    rows = []
    for choice in choices:
        plan = _plan_fixed(prog, choice, plan_kwargs)
        row = {"inputs": {name: [int(d) for d in shape] for name, shape in choice.items()}}
        if varying is not None:
            name, axis = varying
            size = int(tuple(choice[name])[axis])
            row["varying"] = {"input": name, "axis": axis, "size": size}
            if name == query_input:
                row["query_length"] = size
        rows.append({**row, **summary(plan)})
    return rows
