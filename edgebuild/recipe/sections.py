"""Plugin-owned recipe sections, validated once at load by their plugin with the recipe's file:line.

A backend plugin registers ``register("coreml:compression", CompressionModel)``; a
frontend plugin ``register("pytorch:source.options", OptionsModel)``. The validated models
stay on the variant: stages and backends read ``variant.section(name)``, and cache keys take
their JSON from ``variant.params`` (``recipe_params`` below), so no section is parsed twice.
"""

from __future__ import annotations

from pydantic import BaseModel, ValidationError

from edgebuild.errors import RecipeError, UsageError
from edgebuild.first_party import missing_hint
from edgebuild.recipe.errors import format_errors
from edgebuild.recipe.formats import source_format
from edgebuild.recipe.locations import locate


def section_path(name: str) -> tuple[str, ...]:
    """``"coreml:compression"`` -> ``("compression",)``; ``"pytorch:source.options"`` -> ``("source", "options")``."""
    return tuple(name.partition(":")[2].split("."))


def _raw(data: dict, path: tuple[str, ...]):
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _owned_sections(variant, registry) -> list[tuple[str, tuple, object]]:
    recipe = variant.recipe
    try:
        fmt = source_format(recipe.source)
    except UsageError:
        fmt = None
    names = [f"{recipe.target.backend}:compression", f"{recipe.target.backend}:target.options"]
    if fmt is not None and registry.get("frontends", fmt) is not None:  # else check_variant names the format
        names.append(f"{fmt}:source.options")
    return [(name, section_path(name), _raw(variant.data, section_path(name))) for name in names]


def validate_plugin_sections(variant, registry) -> None:
    """The plugin-owned sections, kept typed on the variant; then the checks against the
    registry and the disk (checks.py)."""
    from edgebuild.recipe.checks import check_variant

    if variant.recipe.target.backend is None:  # the one place the default backend is chosen
        variant.recipe.target.backend = registry.default_backend()
    variant.sections = _validate_sections(variant, registry)
    check_variant(variant, registry)


def _validate_sections(variant, registry) -> dict[str, BaseModel]:
    sections = {}
    for name, path, data in _owned_sections(variant, registry):
        if not data:
            continue
        model = registry.get("recipe_sections", name)
        if model is None:
            where = locate(variant.locations, path)
            owner = name.split(":")[0]
            provided = missing_hint("recipe_sections", name)
            raise RecipeError(
                f"{where} {'.'.join(path)}: no installed plugin validates this section for {owner!r}",
                hint=f"{provided}; or remove the section" if provided
                else "install the plugin that provides it, or remove the section",
            )
        suffix = f"\n  (in variant {variant.name!r})" if variant.name != "default" else ""
        try:
            section = model.model_validate(data)
        except ValidationError as exc:
            error = format_errors(exc, data, variant.locations, model, prefix=path)
            error.message += suffix
            raise error from None
        try:
            section.check_recipe(variant.recipe)  # against the rest of the recipe
        except RecipeError as exc:
            exc.message = f"{locate(variant.locations, path)} {'.'.join(path)}: {exc.message}{suffix}"
            raise
        sections[name] = section
    return sections


def typed_section(variant, name: str) -> BaseModel | None:
    """``variant.section(name)``: the model validated at load; None when the recipe leaves the section out."""
    if variant.sections is None and _raw(variant.data, section_path(name)):
        raise RuntimeError(f"{variant.path.name}: the recipe's {'.'.join(section_path(name))} was not validated by "
                           "its plugin; load recipes with the plugin registry (load_variants) to build them")
    return (variant.sections or {}).get(name)


def section_params(section: BaseModel) -> dict:
    """A section as cache-key parameters: every field, defaults applied, as JSON."""
    return section.model_dump(mode="json", by_alias=True)


def recipe_params(variant) -> dict:
    """``variant.params``: the recipe as JSON with defaults applied, plugin sections from their models."""
    params = variant.recipe.model_dump(mode="json", by_alias=True)
    for name, section in (variant.sections or {}).items():
        *parents, last = section_path(name)
        node = params
        for key in parents:
            node = node[key]
        node[last] = section_params(section)
    return params
