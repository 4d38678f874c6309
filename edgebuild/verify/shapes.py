"""The input shapes validation runs at, for inputs the recipe leaves flexible.

A range dim is validated at the smallest, the largest and a seeded random size of its range; an
enumeration at every shape it lists (per-dim enumerations: every combination of sizes). Each
input contributes its list of shapes; shape set ``i`` takes entry ``i`` of every list (cycling
through the shorter lists), so inputs that share a dimension stay consistent: dims with the same
range take the same random size, and inputs enumerated alike pair their shapes in order.

``edgebuild verify`` has no recipe: it feeds both sides at the shapes the artifact takes
(:func:`at_artifact_shapes`).
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping

import numpy as np

from edgebuild.recipe.shapes import per_dim, whole_shapes

SHAPE_SEED = 0  # the random size of every range: the same on every build


def shape_sets(specs: Mapping[str, Mapping[str, Any]], recipe_inputs: Mapping[str, Any],
               seed: int = SHAPE_SEED) -> list[dict[str, dict]]:
    """``specs`` ({input: {"shape", "dtype", ...}} at one concrete shape each) once per shape set.

    Inputs the recipe pins keep their shape in every set; the first set holds each range's
    smallest size and each enumeration's first shape.
    """
    options: dict[str, list[list[int]]] = {}
    for name, spec in specs.items():
        given = recipe_inputs.get(name) or {}
        if "value" in spec or given.get("value") is not None:
            continue
        choices = _shapes_of(given.get("shape"), list(spec["shape"]), seed)
        if len(choices) > 1:
            options[name] = choices
    count = max((len(choices) for choices in options.values()), default=1)
    sets: list[dict[str, dict]] = []
    for index in range(count):
        one = {name: ({**spec, "shape": options[name][index % len(options[name])]} if name in options else dict(spec))
               for name, spec in specs.items()}
        if one not in sets:
            sets.append(one)
    return sets


def range_sizes(low: int, high: int, seed: int = SHAPE_SEED) -> list[int]:
    """Smallest, largest and one seeded random size of ``[low, high]`` (the same for the same range)."""
    middle = int(np.random.default_rng([seed, low, high]).integers(low, high + 1))
    return [low, high, middle]


def _shapes_of(shape: Any, default: list[int], seed: int) -> list[list[int]]:
    """Every shape one input is validated at (its ``default`` when the recipe pins it)."""
    whole = whole_shapes(shape)
    if whole is not None:
        return whole
    dims = per_dim(shape) or []
    if len(dims) != len(default):
        return [default]
    enumerated = {i: [int(s) for s in d["enumerated"]] for i, d in enumerate(dims)
                  if isinstance(d, Mapping) and "enumerated" in d}
    ranged = {i: range_sizes(int(d["range"][0]), int(d["range"][1]), seed) for i, d in enumerate(dims)
              if isinstance(d, Mapping) and "range" in d}
    shapes = []
    for sizes in itertools.product(*enumerated.values()):
        base = list(default)
        for axis, size in zip(enumerated, sizes):
            base[axis] = size
        picks = range(3) if ranged else range(1)
        for pick in picks:
            one = list(base)
            for axis, choices in ranged.items():
                one[axis] = choices[pick]
            if one not in shapes:
                shapes.append(one)
    return shapes


def at_artifact_shapes(source_specs: Mapping[str, Mapping[str, Any]], artifact_shapes: Mapping[str, list[int]] | None,
                       renamed: Mapping[str, str] | None = None) -> dict[str, dict]:
    """``verify``'s input specs: the source model's (``{input: {"shape", "dtype"}}``) at the shapes the
    artifact takes (``Runtime.input_shapes``, by the artifact's names; ``renamed`` maps a source name to the
    artifact's).

    A source input with symbolic dims (a batch ``n``, or -1 as some exporters write) says nothing about the
    size to feed, and the artifact was built at concrete ones: both sides run at the artifact's shape when
    it has the source's rank. Inputs the artifact does not describe keep the source's sizes, a symbolic
    dim taken as 1."""
    renamed = renamed or {}
    specs = {}
    for name, spec in source_specs.items():
        shape = [int(d) if int(d) > 0 else 1 for d in spec["shape"]]
        given = (artifact_shapes or {}).get(renamed.get(name, name))
        if given is not None and len(given) == len(shape) and all(int(d) > 0 for d in given):
            shape = [int(d) for d in given]
        specs[name] = {**spec, "shape": shape}
    return specs
