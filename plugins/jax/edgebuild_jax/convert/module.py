"""A StableHLO module's entry function as an ONNX model in edgebuild's IR."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import onnx_ir as ir

from edgebuild.plugin import BuildError
from edgebuild_jax.convert.context import OPSET, Conversion
from edgebuild_jax.convert.registry import load_families


def entry_function(module, name: str | None, origin: str):
    """The function to convert: ``name``, else ``main``, else the module's only public one."""
    functions = {str(op.attributes["sym_name"]).strip('"'): op
                 for op in module.body.operations if op.operation.name == "func.func"}
    if name is not None:
        if name not in functions:
            raise BuildError(f"{origin}: no function {name!r} in the module (it has {', '.join(sorted(functions))})")
        return functions[name]
    if "main" in functions:
        return functions["main"]
    public = [f for f in functions.values() if str(f.attributes["sym_visibility"]).strip('"') != "private"] \
        if functions else []
    if len(public) != 1:
        raise BuildError(f"{origin}: the module has no main function; name one with source.options.function",
                         hint=f"functions: {', '.join(sorted(functions)) or 'none'}")
    return public[0]


def convert_module(module, *, origin: str, function: str | None = None,
                   input_names: Sequence[str] | None = None, output_names: Sequence[str] | None = None,
                   bound: Mapping[int, np.ndarray] | None = None,
                   dim_names: Mapping[tuple[int, int], str] | None = None) -> ir.Model:
    """The ONNX model of ``module``'s entry function.

    ``bound``: arguments (by position) whose values are known at build time — a JAX function's
    parameters — become initializers, not graph inputs. ``dim_names``: names of dynamic dims by
    (argument position, axis), so a symbolic batch stays one named dim across inputs.
    """
    load_families()
    entry = entry_function(module, function, origin)
    block = entry.regions[0].blocks[0]
    bound = dict(bound or {})
    graph = ir.Graph([], [], nodes=[], name="main", opset_imports={"": OPSET})
    cx = Conversion(module, graph, origin=origin)
    names = list(input_names or [])
    free = [i for i in range(len(block.arguments)) if i not in bound]
    if names and len(names) != len(free):
        raise BuildError(f"{origin}: {len(names)} input names for {len(free)} inputs")
    arguments = []
    for position, mlir_arg in enumerate(block.arguments):
        if position in bound:
            arguments.append(cx.parameter(np.asarray(bound[position]), f"param_{position}"))
            continue
        name = names[free.index(position)] if names else f"input_{free.index(position)}"
        dims = [dim if dim is not None else (dim_names or {}).get((position, axis), f"{name}_dim{axis}")
                for axis, dim in enumerate(cx.shape(mlir_arg))]
        value = ir.Value(name=name, type=ir.TensorType(cx.dtype(mlir_arg)), shape=ir.Shape(dims))
        graph.inputs.append(value)
        arguments.append(value)
    results = cx.convert_block(block, arguments)
    out_names = list(output_names or [])
    if out_names and len(out_names) != len(results):
        raise BuildError(f"{origin}: {len(out_names)} output names for {len(results)} outputs")
    used: set[str] = set()
    terminator = list(block.operations)[-1]
    for index, (value, mlir_value) in enumerate(zip(results, terminator.operands)):
        name = out_names[index] if out_names else f"output_{index}"
        out = value
        if value in graph.inputs or value.producer() is None or value.name in used or value in graph.outputs:
            out = cx.node("Identity", [value])
        out.name = name
        cx.annotate(out, mlir_value)
        used.add(name)
        graph.outputs.append(out)
    return ir.Model(graph, ir_version=10, producer_name="edgebuild-jax")
