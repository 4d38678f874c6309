"""The JSON Schema of recipes, with plugin-owned sections filled in from the installed plugins."""

from __future__ import annotations

from edgebuild.recipe.model import Recipe


def recipe_schema(registry=None) -> dict:
    schema = Recipe.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "edgebuild recipe"
    if registry is None:
        return schema
    props = schema["properties"]
    defs = schema.setdefault("$defs", {})
    for name in sorted(registry.names("recipe_sections")):
        owner, _, path = name.partition(":")
        model = registry.get("recipe_sections", name)
        sub = model.model_json_schema(by_alias=True, ref_template="#/$defs/{model}")
        defs.update(sub.pop("$defs", {}))
        title = f"{owner}_{path.replace('.', '_')}"
        defs[title] = sub
        ref = {"$ref": f"#/$defs/{title}"}
        if path == "compression":
            props["compression"] = {"anyOf": [ref, {"type": "null"}], "description": f"weight compression ({owner})"}
    return schema
