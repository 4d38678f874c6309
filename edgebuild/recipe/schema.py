"""The JSON Schema of recipes, with plugin-owned sections filled in from the installed plugins."""

from __future__ import annotations

from edgebuild.recipe.model import Recipe

# Distributions of this repository. The committed schema covers these, so it does not change
# with whatever else is installed; `edgebuild schema --installed` covers every plugin.
FIRST_PARTY = {"edgebuild", "edgebuild-coreml", "edgebuild-pytorch", "edgebuild-mpsgraph", "edgebuild-msl"}


def recipe_schema(registry=None, *, installed: bool = False) -> dict:
    schema = Recipe.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "edgebuild recipe"
    if registry is None:
        return schema
    props = schema["properties"]
    defs = schema.setdefault("$defs", {})
    compression = []
    for name in sorted(registry.names("recipe_sections")):
        owner, _, path = name.partition(":")
        plugin = registry.plugin_of("recipe_sections", name)
        if not installed and (plugin is None or plugin.distribution not in FIRST_PARTY):
            continue
        model = registry.get("recipe_sections", name)
        sub = model.model_json_schema(by_alias=True, ref_template="#/$defs/{model}")
        defs.update(sub.pop("$defs", {}))
        title = f"{owner}_{path.replace('.', '_')}"
        defs[title] = sub
        ref = {"$ref": f"#/$defs/{title}"}
        if path == "compression":
            compression.append(ref)
    if compression:
        props["compression"] = {"anyOf": [*compression, {"type": "null"}],
                                "description": "weight compression, validated by the target backend's plugin"}
    return schema
