"""Turns the recipe's ``source.inputs`` into call arguments for an eager module.

Inputs with a ``value`` are fixed: bound at build time and absent from the exported graph.
The others are free: the exported graph takes them in recipe order. Flexible dims
(names, ranges, enumerations) are pinned to one size for export: the default, the first
enumerated size or the range's low end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edgebuild.plugin import UsageError
from edgebuild.plugin.recipe import per_dim

SCALAR_TYPES = {"int": int, "float": float, "bool": bool}


def export_dim(dim: Any, name: str, axis: int) -> int:
    if isinstance(dim, bool):
        raise UsageError(f"source.inputs.{name}: dim {axis} is {dim!r}, expected an int")
    if isinstance(dim, int):
        return dim
    if isinstance(dim, dict):
        size = dim.get("default") or (dim.get("enumerated") or [None])[0] or (dim.get("range") or [None])[0]
        if isinstance(size, int):
            return size
    raise UsageError(
        f"source.inputs.{name}: dim {axis} ({dim!r}) has no size to export with",
        hint="PyTorch sources are exported with static shapes: give an int, or a range with a default",
    )


@dataclass
class InputPlan:
    """Free inputs (name -> shape, dtype) in call order and fixed inputs (name -> value)."""

    free: dict[str, tuple[list[int], str]]
    fixed: dict[str, Any]

    def example_arrays(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Values to trace with: small normal floats; ones for integers (valid ids and masks)."""
        rng = np.random.default_rng(seed)
        arrays = {}
        for name, (shape, dtype) in self.free.items():
            if np.issubdtype(np.dtype(dtype), np.floating):
                arrays[name] = rng.standard_normal(shape).astype(dtype)
            else:
                arrays[name] = np.ones(shape, dtype=dtype)
        return arrays


def plan_inputs(inputs: dict[str, dict] | None) -> InputPlan:
    free, fixed = {}, {}
    for name, spec in (inputs or {}).items():
        spec = spec or {}
        dtype = spec.get("dtype") or "float32"
        if spec.get("value") is not None:
            value = np.asarray(spec["value"], dtype=dtype)
            if spec.get("shape") is not None:
                value = value.reshape([export_dim(d, name, i) for i, d in enumerate(per_dim(spec["shape"]))])
            fixed[name] = value
            continue
        if spec.get("shape") is None:
            raise UsageError(
                f"source.inputs.{name}: a PyTorch source needs the shape of every input",
                hint=f"give source.inputs.{name}.shape (and dtype), or a fixed value",
            )
        free[name] = ([export_dim(d, name, i) for i, d in enumerate(per_dim(spec["shape"]))], dtype)
    if not free:
        raise UsageError("source.inputs: a PyTorch source needs at least one input with a shape")
    return InputPlan(free, fixed)


def scalar_types(module) -> dict[str, type]:
    """Arguments a TorchScript ``forward`` declares as int/float/bool: they are passed as Python scalars."""
    schema = getattr(getattr(module, "forward", None), "schema", None)
    if schema is None:
        return {}
    found = {}
    for argument in schema.arguments:
        kind = str(argument.type)
        if kind in SCALAR_TYPES:
            found[argument.name] = SCALAR_TYPES[kind]
    return found


def to_argument(name: str, array: np.ndarray, scalars: dict[str, type]):
    """A numpy value as the module expects it: a Python scalar where the signature says so, else a tensor."""
    import torch

    array = np.asarray(array)
    if name in scalars and array.size == 1:
        return scalars[name](array.reshape(()).item())
    return torch.from_numpy(np.ascontiguousarray(array))
