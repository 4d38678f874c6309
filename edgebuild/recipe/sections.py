"""Plugin-owned recipe sections, validated by their plugin with the recipe's file:line.

A backend plugin registers ``register("coreml:compression", CompressionModel)``; a
frontend plugin ``register("pytorch:source.options", OptionsModel)``.
"""

from __future__ import annotations

from pydantic import ValidationError

from edgebuild.errors import RecipeError
from edgebuild.recipe.errors import format_errors
from edgebuild.recipe.locations import locate


def _owned_sections(variant) -> list[tuple[str, tuple, object]]:
    recipe = variant.recipe
    backend = recipe.target.backend
    fmt = recipe.source.format or ("onnx" if recipe.source.model.lower().endswith(".onnx") else "pytorch")
    return [
        (f"{backend}:compression", ("compression",), variant.data.get("compression")),
        (f"{backend}:target.options", ("target", "options"), (variant.data.get("target") or {}).get("options")),
        (f"{fmt}:source.options", ("source", "options"), (variant.data.get("source") or {}).get("options")),
    ]


def validate_plugin_sections(variant, registry) -> None:
    """The plugin-owned sections, then the checks against the registry and the disk (checks.py)."""
    from edgebuild.recipe.checks import check_variant

    _validate_sections(variant, registry)
    check_variant(variant, registry)


def _validate_sections(variant, registry) -> None:
    for name, path, data in _owned_sections(variant):
        if not data:
            continue
        model = registry.get("recipe_sections", name)
        if model is None:
            where = locate(variant.locations, path)
            owner = name.split(":")[0]
            raise RecipeError(
                f"{where} {'.'.join(path)}: no installed plugin validates this section for {owner!r}",
                hint="install the plugin that provides it, or remove the section",
            )
        suffix = f"\n  (in variant {variant.name!r})" if variant.name != "default" else ""
        try:
            section = model.model_validate(data)
        except ValidationError as exc:
            error = format_errors(exc, data, variant.locations, model, prefix=path)
            error.message += suffix
            raise error from None
        check = getattr(section, "check_recipe", None)  # a section may check itself against the recipe
        if check is not None:
            try:
                check(variant.recipe)
            except RecipeError as exc:
                exc.message = f"{locate(variant.locations, path)} {'.'.join(path)}: {exc.message}{suffix}"
                raise
