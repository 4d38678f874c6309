"""Load a recipe file: ``extends:`` chains, variants, validation with file:line errors."""

from __future__ import annotations

import gc
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ValidationError

from edgebuild.errors import RecipeError
from edgebuild.recipe.errors import format_errors
from edgebuild.recipe.locations import load_yaml, locate
from edgebuild.recipe.matrix import expand as expand_matrix
from edgebuild.recipe.merge import deep_merge, merge_locations
from edgebuild.recipe.model import Recipe
from edgebuild.recipe.sections import recipe_params, typed_section

DEFAULT_VARIANT = "default"
MAX_EXTENDS = 16  # files in one extends: chain, the recipe itself included
# a variant name becomes a directory under outputs.dir: no separators, no "." or ".."
VARIANT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")


@dataclass
class Variant:
    """A recipe with one variant's overrides applied, ready to build."""

    name: str
    recipe: Recipe
    path: Path  # the recipe file the user named
    data: dict  # the merged data, for plugin-owned sections
    locations: dict = field(repr=False, default_factory=dict)
    includes: list[Path] = field(default_factory=list)  # files pulled in by extends:
    # plugin-owned sections by registered name ("coreml:compression"), as their plugins' models;
    # None until the plugins validated them (``sections.validate_plugin_sections``)
    sections: Optional[dict[str, BaseModel]] = field(default=None, repr=False)

    @property
    def base_dir(self) -> Path:
        return self.path.parent

    def section(self, name: str) -> BaseModel | None:
        """The plugin-owned section ``name`` (``"coreml:compression"``) as its plugin's model,
        validated once at load; None when the recipe leaves it out."""
        return typed_section(self, name)

    @cached_property
    def params(self) -> dict:
        """The recipe as JSON with defaults applied, plugin sections included: what stages put
        into cache keys. Computed once; do not mutate."""
        return recipe_params(self)

    def output_dir(self) -> Path:
        out = self.recipe.outputs.dir or f"build/{self.recipe.name}"
        return (self.base_dir / out / self.name).resolve()


def _display(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def _load_chain(path: Path, chain: tuple[Path, ...] = ()) -> tuple[dict, dict, list[Path]]:
    """Data and locations of ``path`` with every file it extends merged underneath."""
    path = path.resolve()
    data, locations = load_yaml(path, _display(path))
    if data is None:
        raise RecipeError(f"{_display(path)}:1:1 the recipe is empty",
                          hint="a recipe needs at least edgebuild: 1, name and source.model (see `edgebuild init MODEL`)")
    if not isinstance(data, dict):
        raise RecipeError(f"{_display(path)}:1:1 a recipe is a mapping of keys (edgebuild, name, source, ...)")
    parent = data.get("extends")
    if parent is None:
        return data, locations, []
    if not isinstance(parent, str):
        raise RecipeError(f"{locate(locations, ('extends',))} extends: must be a path to a recipe file")
    parent_path = (path.parent / parent)
    if not parent_path.exists():
        raise RecipeError(f"{locate(locations, ('extends',))} extends: no such file {parent!r}")
    if parent_path.is_dir():
        raise RecipeError(f"{locate(locations, ('extends',))} extends: {parent!r} is a directory, not a recipe file")
    if parent_path.resolve() in chain + (path,):
        cycle = " -> ".join(_display(p) for p in chain + (path, parent_path.resolve()))
        raise RecipeError(f"{locate(locations, ('extends',))} extends cycle: {cycle}",
                          hint="a recipe cannot extend itself, directly or through its bases")
    if len(chain) + 2 > MAX_EXTENDS:
        raise RecipeError(f"{locate(locations, ('extends',))} extends: the chain is longer than {MAX_EXTENDS} files",
                          hint="flatten the chain: a recipe that extends a base that extends a base is usually enough")
    base, base_locations, includes = _load_chain(parent_path, chain + (path,))
    base = {k: v for k, v in base.items() if k != "extends"}
    return deep_merge(base, data), merge_locations(base_locations, locations), includes + [parent_path.resolve()]


def _split_locations(locations: dict) -> tuple[dict, dict[str, dict]]:
    """The locations outside ``variants:``, and each variant's own (paths relative to its
    overrides): one pass, so a recipe with many variants loads in time linear in their number."""
    base, by_variant = {}, {}
    for path, loc in locations.items():
        if path[:1] != ("variants",):
            base[path] = loc
        elif len(path) > 2:
            by_variant.setdefault(path[1], {})[path[2:]] = loc
    return base, by_variant


def load_recipe(path: Path | str, *, only: list[str] | None = None, sections=None,
                matrix: dict[str, list[str]] | None = None) -> list[Variant]:
    """Every variant of the recipe at ``path`` (or just ``only``), validated: the named
    ``variants:`` and those its ``matrix:`` makes (``matrix``: axes narrowed by ``--matrix``).

    ``sections`` validates plugin-owned sections: ``sections(variant)`` raises RecipeError.
    """
    with _collector_paused():
        return _load_recipe(Path(path), only, sections, matrix)


@contextmanager
def _collector_paused():
    """Loading makes many small objects (YAML nodes, locations, models) and no reference cycles
    worth collecting; the cyclic collector would rescan them all again and again (a recipe with
    10,000 variants spent most of its load time there). Bounded: a recipe has at most
    ``locations.MAX_VALUES`` values."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _load_recipe(path: Path, only, sections, matrix) -> list[Variant]:
    data, locations, includes = _load_chain(path)
    variants = data.get("variants") or {}
    if not isinstance(variants, dict):
        raise RecipeError(f"{locate(locations, ('variants',))} variants: must map variant names to overrides")
    for name in variants:
        _check_variant_name(name, locations)
    cells = {cell.name: cell for cell in expand_matrix(data.get("matrix"), locations, given=matrix,
                                                        explicit=variants, display=_display(path))}
    for name in cells:
        _check_variant_name(name, locations, where=locate(locations, ("matrix",)))
    names = list(variants) + list(cells) or [DEFAULT_VARIANT]
    known = set(names)
    for name in only or []:
        if name not in known:
            raise RecipeError(
                f"{_display(path)}: no variant {name!r}; the recipe has {', '.join(names)}"
            )
    # validate the base once, so an error in it is reported once with its own location
    matrix_data = data.get("matrix")
    base = {k: v for k, v in data.items() if k not in ("variants", "matrix")}
    base_locations = {p: l for p, l in locations.items() if p[:1] not in (("variants",), ("matrix",))}
    _validate(dict(base, variants={}, matrix=matrix_data), {**base_locations, **_matrix_locations(locations)})
    # each variant is validated as the recipe it builds, without the other variants and the matrix
    # (they are checked above and by the loops below; carrying them made loading quadratic)
    outside_variants, variant_locations = _split_locations(locations)
    result = []
    for name in only or names:
        if name in cells:
            merged = deep_merge(base, cells[name].override)
            merged_locations = merge_locations(base_locations, cells[name].locations)
            recipe = _validate(merged, merged_locations, prefix_variant=name)
            variant = Variant(name, recipe, path.resolve(), merged, merged_locations, includes)
            if sections is not None:
                sections(variant)
            result.append(variant)
            continue
        override = variants.get(name) or {}
        if not isinstance(override, dict):
            raise RecipeError(f"{locate(locations, ('variants', name))} variants.{name}: must be a mapping of overrides")
        if "variants" in override or "extends" in override:
            raise RecipeError(f"{locate(locations, ('variants', name))} variants.{name}: a variant cannot set variants or extends")
        merged = deep_merge(base, override)
        merged_locations = merge_locations(outside_variants, variant_locations.get(name, {}))
        recipe = _validate(merged, merged_locations, prefix_variant=name)
        variant = Variant(name, recipe, path.resolve(), merged, merged_locations, includes)
        if sections is not None:
            sections(variant)
        result.append(variant)
    return result


def _matrix_locations(locations: dict) -> dict:
    return {p: l for p, l in locations.items() if p[:1] == ("matrix",)}


def _check_variant_name(name, locations: dict, where=None) -> None:
    label = f"matrix: variant {name}" if where else f"variants.{name}"
    where = where or locate(locations, ("variants", str(name)), key=True) or locate(locations, ("variants",))
    if not isinstance(name, str):
        raise RecipeError(f"{where} {label}: a variant name is text; YAML read this one as "
                          f"{type(name).__name__} {name!r}", hint=f"quote it: '{name}'")
    if not VARIANT_NAME.fullmatch(name):
        raise RecipeError(
            f"{where} {label}: {name!r} is not a valid variant name: use letters, digits, '_', '-' "
            f"and '.', starting with a letter, digit or '_' (at most 100 characters)",
            hint="the name becomes a directory under outputs.dir, so it cannot contain '/' or be '.' or '..'")


def _validate(data: dict, locations: dict, prefix_variant: str | None = None) -> Recipe:
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        error = format_errors(exc, data, locations, Recipe)
        if prefix_variant:
            error.message += f"\n  (in variant {prefix_variant!r})"
        raise error from None
