"""Generate the recipe reference (docs/recipe-reference.md) from the recipe JSON Schema.

Run by ``make docs``; a test fails when the committed page or ``schemas/recipe.schema.json``
is stale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = ROOT / "schemas" / "recipe.schema.json"
REFERENCE_PATH = ROOT / "docs" / "recipe-reference.md"


def schema_text() -> str:
    from edgebuild.recipe.schema import schema_text
    from edgebuild.registry import get_registry

    return schema_text(get_registry())  # first-party only: what `edgebuild schema` writes


def _type(prop: dict, defs: dict) -> str:
    if "$ref" in prop:
        return f"[{prop['$ref'].split('/')[-1]}](#{prop['$ref'].split('/')[-1].lower()})"
    if "anyOf" in prop:
        return " or ".join(_type(p, defs) for p in prop["anyOf"])
    if "enum" in prop:
        return "one of " + ", ".join(f"`{v}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{prop['const']}`"
    kind = prop.get("type", "any")
    if kind == "array":
        items = prop.get("items") or prop.get("prefixItems")
        inner = _type(items, defs) if isinstance(items, dict) else ", ".join(_type(i, defs) for i in items or [])
        return f"list of {inner}" if inner else "list"
    if kind == "object" and isinstance(prop.get("additionalProperties"), dict):
        return f"map of name → {_type(prop['additionalProperties'], defs)}"
    return str(kind)


def _section(title: str, schema: dict, defs: dict) -> list[str]:
    lines = [f"## {title}", ""]
    if schema.get("description"):
        lines += [schema["description"].strip(), ""]
    props = schema.get("properties", {})
    if not props:
        return lines
    required = set(schema.get("required", []))
    lines += ["| key | type | default | description |", "|---|---|---|---|"]
    for name, prop in props.items():
        default = "required" if name in required else f"`{json.dumps(prop['default'])}`" if "default" in prop else ""
        description = (prop.get("description") or "").replace("\n", " ").replace("|", "\\|")
        lines.append(f"| `{name}` | {_type(prop, defs).replace('|', '/')} | {default} | {description} |")
    return lines + [""]


def reference_text(schema: dict) -> str:
    defs = schema.get("$defs", {})
    lines = [
        "# Recipe reference",
        "",
        "Generated from `schemas/recipe.schema.json` by `make docs`; do not edit by hand.",
        "Sections owned by a plugin (such as `compression` for the Core ML backend) are",
        "included for the plugins installed when it was generated.",
        "",
    ]
    lines += _section("Recipe", schema, defs)
    for name in sorted(defs):
        lines += _section(name, defs[name], defs)
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    from edgebuild.errors import UsageError
    from edgebuild.recipe.schema import check_replace
    from edgebuild.registry import get_registry

    text = schema_text()
    try:
        check_replace(SCHEMA_PATH, text, get_registry())  # never a schema shrunk by a missing plugin
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    SCHEMA_PATH.parent.mkdir(exist_ok=True)
    SCHEMA_PATH.write_text(text)
    REFERENCE_PATH.write_text(reference_text(json.loads(text)))
    print(f"wrote {SCHEMA_PATH.relative_to(ROOT)} and {REFERENCE_PATH.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
