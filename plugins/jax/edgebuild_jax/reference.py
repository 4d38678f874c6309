"""The validation reference for a StableHLO source: JAX itself, on the CPU, running the module.

A ``.jaxexport`` runs as the ``Exported`` it is. An MLIR module is wrapped as one: its entry
function's types give the abstract values, and ``Exported.call`` compiles the portable artifact
exactly as it compiles JAX's own exports. A JAX model is so held to what JAX computes.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np


class JaxRunner:
    """``runner(inputs) -> {output name: array}``; ``input_specs`` are the module's argument types,
    with the recipe's fixed values."""

    def __init__(self, exported, input_names: Sequence[str], output_names: Sequence[str], recipe_inputs: Mapping,
                 params=None):
        import jax

        self.exported, self.input_names, self.output_names = exported, list(input_names), list(output_names)
        self.params = params  # a JAX function's parameters: its first argument
        self.origin = "the source"  # named in messages; the frontend sets the file's name
        self._float64 = None
        self._skipped = skipped = len(jax.tree_util.tree_leaves(params)) if params is not None else 0
        self.input_specs = {}
        for name, aval in zip(self.input_names, exported.in_avals[skipped:]):
            given = recipe_inputs.get(name) or {}
            shape = [sample_size(dim, given.get("shape"), axis, name) for axis, dim in enumerate(aval.shape)]
            self.input_specs[name] = {"shape": shape, "dtype": _fed_as(aval.dtype).name}
            if given.get("value") is not None:
                self.input_specs[name]["value"] = given["value"]

    def float64(self):
        """``(runner, evaluator)`` of the module restated in float64 (``edgebuild_jax.float64``), made once."""
        if self._float64 is None:
            from edgebuild_jax.float64 import float64_runner

            self._float64 = float64_runner(bytes(self.exported.mlir_module_serialized), origin=self.origin,
                                           entry=self.exported.fun_name, input_names=list(self.input_specs),
                                           output_names=self.output_names, params=self.params)
        return self._float64

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        import jax

        # a module traced with 64-bit types (x64 on at export) runs only with x64 on again
        wide = any(np.dtype(aval.dtype).itemsize == 8 for aval in (*self.exported.in_avals, *self.exported.out_avals))
        with jax.enable_x64(wide), jax.default_device(jax.devices("cpu")[0]):
            arrays = [np.asarray(inputs[name]).astype(aval.dtype)
                      for name, aval in zip(self.input_specs, self.exported.in_avals[self._skipped:])]
            prefix = (self.params,) if self.params is not None else ()
            results = jax.tree_util.tree_leaves(self.exported.call(*prefix, *arrays))
        return {name: np.asarray(value).astype(_fed_as(value.dtype)) for name, value in zip(self.output_names, results)}


def _fed_as(dtype) -> np.dtype:
    """The type validation feeds and compares a value of the module's ``dtype`` in: bfloat16 as
    float32, which the converted graph carries it in (``convert.types.CARRIED``)."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype.name == "bfloat16" else dtype


def sample_size(dim, recipe_shape, axis: int, name: str) -> int:
    """The size validation samples a dim at: the module's when static; a symbolic one's from the
    recipe (its fixed size, a range's default or first bound, an enumeration's first size)."""
    if isinstance(dim, int):
        return dim
    from edgebuild.plugin.recipe import per_dim

    recipe_shape = per_dim(recipe_shape)  # a whole-shape enumeration as its dims
    entry = recipe_shape[axis] if isinstance(recipe_shape, list) and axis < len(recipe_shape) else None
    if isinstance(entry, int):
        return entry
    if isinstance(entry, dict):
        for key in ("default", "enumerated", "range"):
            value = entry.get(key)
            value = value[0] if isinstance(value, list) and value else value
            if isinstance(value, int):
                return value
    from edgebuild.plugin import RecipeError

    # the path says which input lacks a size, so a caller with no recipe (verify) can ask for it its own way
    raise RecipeError(f"source.inputs.{name}.shape: dim {axis} of input {name!r} is symbolic ({dim}) in the module, "
                      "and nothing gives it a size", hint=f"give it a size, a range or an enumeration, e.g. inputs: "
                      f"{{{name}: {{shape: [1, ...]}}}}", path=("source", "inputs", name, "shape", axis))


def reference_runner(loaded, entry, input_names: Sequence[str], output_names: Sequence[str],
                     recipe_inputs: Mapping | None = None) -> Runner:
    return JaxRunner(loaded.exported or _as_exported(loaded, entry), input_names, output_names, recipe_inputs or {},
                     loaded.params)


def _as_exported(loaded, entry):
    """An ``Exported`` over the module's portable artifact, for a module ``jax.export`` did not write."""
    import jax
    from jax import export as jax_export

    from edgebuild_jax.convert.types import source_dtype, tensor_shape

    with loaded.context:
        block = entry.regions[0].blocks[0]
        in_avals = tuple(jax.core.ShapedArray(tuple(tensor_shape(a.type)), source_dtype(a.type))
                         for a in block.arguments)
        results = list(block.operations)[-1].operands
        out_avals = tuple(jax.core.ShapedArray(tuple(tensor_shape(r.type)), source_dtype(r.type)) for r in results)
    if any(None in a.shape for a in in_avals + out_avals):
        from edgebuild.plugin import BuildError

        raise BuildError("the module has dynamic shapes: JAX can run it as the reference only when they are static",
                         hint="export it for the recipe's shapes")
    n_in, n_out = len(in_avals), len(out_avals)
    return jax_export.Exported(
        fun_name=str(entry.attributes["sym_name"]).strip('"'),
        in_tree=jax.tree_util.tree_structure((tuple(range(n_in)), {})), in_avals=in_avals,
        out_tree=jax.tree_util.tree_structure(tuple(range(n_out))), out_avals=out_avals,
        _has_named_shardings=False, _in_named_shardings=(None,) * n_in, _out_named_shardings=(None,) * n_out,
        in_shardings_hlo=(None,) * n_in, out_shardings_hlo=(None,) * n_out, nr_devices=1, platforms=("cpu",),
        ordered_effects=(), unordered_effects=(), disabled_safety_checks=(),
        mlir_module_serialized=loaded.portable, calling_convention_version=jax_export.maximum_supported_calling_convention_version,
        module_kept_var_idx=tuple(range(n_in)), uses_global_constants=False, _get_vjp=None)
