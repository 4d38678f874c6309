"""The ``stablehlo`` frontend: a StableHLO module (a jax.export, MLIR text or bytecode) -> ``model.onnx``."""

from __future__ import annotations

import time
from pathlib import Path

from edgebuild.plugin import BuildError, EdgebuildError, Frontend
from edgebuild_jax.options import StableHLOOptions, parse_options
from edgebuild_jax.plugin import LIBRARIES


class StableHLOFrontend(Frontend):
    """Registered as the ``stablehlo`` frontend; see the plugin's README for the recipe options."""

    libraries = LIBRARIES  # edgebuild_jax.plugin says why
    sizes_derived_inputs = True  # a generative step's symbolic query length is sized by generate.query_lengths

    def import_model(self, path: Path, inputs: dict[str, dict], out_dir: Path, *,
                     options: StableHLOOptions | dict | None = None, base_dir: Path | None = None) -> dict:
        from edgebuild.plugin.graph import OnnxFrontend

        from edgebuild_jax.convert.module import convert_module, entry_function
        from edgebuild_jax.loading import load_source, value_names

        start = time.perf_counter()
        path, opts = Path(path), parse_options(options)
        loaded = load_source(path, opts, inputs)
        with loaded.context:
            entry = entry_function(loaded.module, opts.function, path.name)
            names_in, names_out = value_names(loaded, entry, opts)
            if loaded.bound is None:
                check_dynamic_dims(entry, names_in, inputs or {}, path.name)
            try:
                model = convert_module(loaded.module, origin=path.name, function=opts.function,
                                       input_names=names_in, output_names=names_out, bound=loaded.bound)
            except EdgebuildError:
                raise
            except Exception as exc:
                raise BuildError(f"{path.name}: converting the StableHLO module failed: {type(exc).__name__}: {exc}",
                                 hint="report the module; `edgebuild plugins` shows the converters installed") \
                    from exc
        ops = sorted({op.operation.name for op in _walk(loaded, entry)})
        pinned = {} if loaded.bound is not None else (inputs or {})  # a function was exported for them
        report = OnnxFrontend().import_ir(model, path, pinned, out_dir)
        kind = "function" if loaded.bound is not None else "exported" if loaded.exported is not None else "mlir"
        report.update({"kind": kind, "stablehlo_ops": ops,
                       "outputs_named": names_out, "seconds": round(time.perf_counter() - start, 3)})
        return report

    def reference(self, path: Path, inputs: dict[str, dict], options: StableHLOOptions | None,
                  base_dir: Path | None = None):
        """JAX on the CPU running the source module (``edgebuild_jax.reference``)."""
        from edgebuild_jax.convert.module import entry_function
        from edgebuild_jax.loading import load_source, value_names
        from edgebuild_jax.reference import reference_runner

        path, opts = Path(path), parse_options(options)
        loaded = load_source(path, opts, inputs)
        with loaded.context:
            entry = entry_function(loaded.module, opts.function, path.name)
            names_in, names_out = value_names(loaded, entry, opts)
            runner = reference_runner(loaded, entry, names_in, names_out, inputs or {})
        runner.origin = path.name
        return runner

    def input_specs(self, inputs: dict[str, dict]) -> dict[str, dict]:
        """The recipe's inputs as the reference takes them: shape, dtype and any fixed value."""
        specs = {}
        for name, spec in (inputs or {}).items():
            specs[name] = {key: spec[key] for key in ("shape", "dtype", "value") if spec.get(key) is not None}
        return specs


def check_dynamic_dims(entry, names: list[str], inputs: dict, origin: str) -> None:
    """Every dynamic dim of the entry function's arguments must be pinned, bounded or enumerated by
    the recipe: Core ML needs a size, or a range or set of sizes, for each."""
    from edgebuild_jax.convert.types import tensor_shape

    block = entry.regions[0].blocks[0]
    for name, argument in zip(names, block.arguments):
        shape = tensor_shape(argument.type)
        given = (inputs.get(name) or {}).get("shape")
        for axis, dim in enumerate(shape):
            if dim is not None:
                continue
            entry_dim = given[axis] if isinstance(given, list) and axis < len(given) else None
            if given is None or isinstance(given, list) and not isinstance(entry_dim, (int, dict)):
                sized_by = (inputs.get(name) or {}).get("sized_by")
                if sized_by:  # an input the generative artifact feeds: its recipe field, not source.inputs
                    raise BuildError(f"{origin}: input {name!r} has a dynamic dim {axis} ({shape}), which a "
                                     f"generative recipe sizes from {sized_by}, left at its default [1]",
                                     hint=f"give {sized_by} the lengths the artifact takes, e.g. [1, 64] or "
                                          "{range: [1, 64]} (within the export's constraint), or export the "
                                          "step for input_ids [1, 1]")
                raise BuildError(f"{origin}: input {name!r} has a dynamic dim {axis} ({shape}) the recipe does not "
                                 "pin or bound",
                                 hint=f"give source.inputs.{name}.shape a size, {{range: [LOW, HIGH]}} or "
                                      "{enumerated: [...]} at that dim")


def _walk(loaded, entry):
    """Every op of the entry function and the functions it reaches, regions included."""
    with loaded.context:
        stack = [entry]
        while stack:
            op = stack.pop()
            yield op
            for region in op.regions:
                for block in region.blocks:
                    stack.extend(block.operations)
