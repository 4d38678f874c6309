"""A StableHLO source on disk -> its module, the entry function's value names, and an ``Exported``
that JAX itself can run (the validation reference)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from edgebuild.plugin import BuildError, UsageError
from edgebuild_jax.mlir import new_context, parse_module
from edgebuild_jax.options import KIND_BY_SUFFIX, StableHLOOptions

_NAME = re.compile(r'^loc\("([A-Za-z_][\w.]*)"\)$')  # jax.export names an argument loc("x")
_SAFE = re.compile(r"[^\w.]+")


@dataclass
class LoadedSource:
    context: object
    module: object
    portable: bytes  # the module as a StableHLO portable artifact: what jax.export's call() compiles
    exported: object | None  # the deserialized (or, for a function, made) Exported
    params: object = None  # a function's parameter pytree: the reference passes it first
    bound: dict | None = None  # a function's parameters by argument position: initializers, not inputs
    free_names: list | None = None  # a function's input names, in argument order


def source_kind(path: Path, options: StableHLOOptions) -> str:
    if options.kind:
        return options.kind
    if options.factory:
        return "function"
    kind = KIND_BY_SUFFIX.get(path.suffix.lower())
    if kind is None:
        raise UsageError(f"source.model: {path.name}: cannot tell what the file holds; set source.options.kind "
                         "(exported or mlir)")
    return kind


def load_source(path: Path, options: StableHLOOptions, inputs: dict | None = None) -> LoadedSource:
    context = new_context()
    exported = None
    if source_kind(path, options) == "function":
        from edgebuild_jax.function_source import export_function

        exported, params, bound, names = export_function(Path(path), options, inputs or {})
        portable = bytes(exported.mlir_module_serialized)
        module = parse_module(portable, context, origin=path)
        return LoadedSource(context, module, portable, exported, params, bound, names)
    data = Path(path).read_bytes()
    if source_kind(path, options) == "exported":
        from jax import export as jax_export

        try:
            exported = jax_export.deserialize(bytearray(data))
        except Exception as exc:
            raise BuildError(f"{path.name}: not a serialized jax.export: {type(exc).__name__}: {exc}",
                             hint="write it with jax.export.export(...)(...).serialize(); for MLIR set kind: mlir") \
                from exc
        portable = bytes(exported.mlir_module_serialized)
    else:
        portable = b""
    module = parse_module(portable or data, context, origin=path)
    if not portable:
        portable = _portable_artifact(module, context)
    return LoadedSource(context, module, portable, exported)


def _portable_artifact(module, context) -> bytes:
    from jaxlib.mlir.dialects import stablehlo

    with context:
        return bytes(stablehlo.serialize_portable_artifact_str(str(module), stablehlo.get_current_version()))


def value_names(loaded: LoadedSource, entry, options: StableHLOOptions) -> tuple[list[str], list[str]]:
    """The names of the entry function's arguments and results: the options', else what the
    export recorded, else positional names. Every name is a plain identifier."""
    with loaded.context:
        block = entry.regions[0].blocks[0]
        recorded_in = [_NAME.match(str(arg.location)) for arg in block.arguments]
        if not all(recorded_in):
            recorded_in = _wrapped_names(loaded.module, block) or recorded_in
        expected = len(block.arguments) - len(loaded.bound or {})
        inputs = options.input_names or loaded.free_names or (
            [m.group(1) for m in recorded_in] if all(recorded_in) and len({m.group(1) for m in recorded_in}) ==
            len(recorded_in) else [f"input_{i}" for i in range(len(block.arguments))])
        results = list(entry.attributes["res_attrs"]) if "res_attrs" in entry.attributes else []
        infos = [_result_info(attr) for attr in results]
        count = len(list(block.operations)[-1].operands)
        if options.output_names:
            outputs = list(options.output_names)
        elif len(infos) == count and all(infos) and len(set(infos)) == count:
            outputs = infos
        else:
            outputs = [f"output_{i}" for i in range(count)]
    if len(inputs) != expected:
        raise UsageError(f"source.options.input_names: {len(inputs)} names for {expected} arguments")
    if len(outputs) != count:
        raise UsageError(f"source.options.output_names: {len(outputs)} names for {count} results")
    return inputs, outputs


def _wrapped_names(module, block) -> list | None:
    """A shape-polymorphic jax.export's main passes its arguments on to ``_wrapped_jax_export_main``,
    after the dimension variables it computes (marked ``jax.global_constant``); the names are there."""
    wrapped = next((op for op in module.body.operations if op.operation.name == "func.func"
                    and str(op.attributes["sym_name"]).strip('"') == "_wrapped_jax_export_main"), None)
    if wrapped is None:
        return None
    attrs = list(wrapped.attributes["arg_attrs"]) if "arg_attrs" in wrapped.attributes else []
    arguments = wrapped.regions[0].blocks[0].arguments
    names = [_NAME.match(str(arg.location)) for index, arg in enumerate(arguments)
             if not (index < len(attrs) and "jax.global_constant" in str(attrs[index]))]
    return names if len(names) == len(block.arguments) and all(names) else None


def _result_info(attr) -> str | None:
    text = str(attr)
    found = re.search(r'jax\.result_info = "([^"]*)"', text)
    if not found:
        return None
    name = _SAFE.sub("_", found.group(1).replace("[", "_").replace("]", "")).strip("_.")
    return name or None
