"""The shapes a JAX function is exported for: the recipe's fixed sizes, and a symbolic dim where
the recipe asks for a range, an enumeration or a name, so one export serves every size.

Dims the recipe spells alike share one symbol (two inputs whose sequence dim is
``{range: [1, 128]}`` have the same length), as validation gives them the same size; a name is
its own symbol. The enumerations of one input are validated in every combination, so each of
them is its own symbol there (the n-th alike in another input shares the n-th's). A range's or
enumeration's bounds become the symbol's constraints, so JAX can prove what the model assumes (a
sequence no longer than its position table).
"""

from __future__ import annotations

import json
import re
from typing import Mapping

from edgebuild.plugin import UsageError
from edgebuild.plugin.recipe import per_dim

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def export_specs(inputs: Mapping[str, Mapping]) -> tuple[list[str], list]:
    """``(input names, jax.ShapeDtypeStruct per input)`` for the recipe's ``source.inputs``, in
    order; the symbolic dims of every input in one scope."""
    import jax
    import numpy as np
    from jax import export as jax_export

    names, dims_by_input, symbols, constraints = [], [], {}, []
    for name, spec in inputs.items():
        if spec.get("value") is not None:
            raise UsageError(f"source.inputs.{name}: a JAX function's inputs are all free; bind a constant in the "
                             "factory instead")
        dims = per_dim(spec.get("shape"))
        if not dims or not spec.get("dtype"):
            raise UsageError(f"source.inputs.{name}: a JAX function is exported for its inputs' shapes: give shape "
                             "(sizes, {range: [LOW, HIGH]} or {enumerated: [...]}) and dtype")
        spelled, seen = [], {}
        for axis, dim in enumerate(dims):
            if isinstance(dim, int) and not isinstance(dim, bool):
                spelled.append(str(dim))
                continue
            key = json.dumps(dim, sort_keys=True)
            if isinstance(dim, Mapping) and "enumerated" in dim:
                # validation takes every combination of one input's enumerations: each its own size
                seen[key] = seen.get(key, -1) + 1
                key = f"{key}#{seen[key]}"
            if key not in symbols:
                symbols[key] = _symbol(dim, len(symbols), f"source.inputs.{name}.shape[{axis}]")
                constraints += _bounds(symbols[key], dim)
            spelled.append(symbols[key])
        names.append(name)
        dims_by_input.append((spelled, np.dtype(spec["dtype"])))
    if not names:
        raise UsageError("source.inputs: a JAX function needs its inputs' shapes and dtypes, in argument order")
    if not symbols:
        return names, [jax.ShapeDtypeStruct(tuple(int(d) for d in dims), dtype) for dims, dtype in dims_by_input]
    # one scope: parse every input's dims together, then split them back per input
    together = jax_export.symbolic_shape(", ".join(d for dims, _ in dims_by_input for d in dims),
                                         constraints=constraints)
    specs, at = [], 0
    for dims, dtype in dims_by_input:
        specs.append(jax.ShapeDtypeStruct(tuple(together[at:at + len(dims)]), dtype))
        at += len(dims)
    return names, specs


def _symbol(dim, index: int, where: str) -> str:
    if isinstance(dim, str):
        if not _NAME.match(dim):
            raise UsageError(f"{where}: a dim name is an identifier (letters, digits, _), not {dim!r}")
        return dim
    if isinstance(dim, Mapping) and ("range" in dim or "enumerated" in dim):
        return f"_d{index}"
    raise UsageError(f"{where}: {dim!r} is not a size, a name, {{range: [LOW, HIGH]}} or {{enumerated: [...]}}")


def _bounds(symbol: str, dim) -> list[str]:
    if not isinstance(dim, Mapping):
        return []
    sizes = list(dim["range"]) if "range" in dim else [int(s) for s in dim["enumerated"]]
    low, high = min(int(s) for s in sizes), max(int(s) for s in sizes)
    found = [f"{symbol} >= {low}"] if low > 1 else []  # every symbol is at least 1 already
    return found + [f"{symbol} <= {high}"]
