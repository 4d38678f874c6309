"""The JSON Schema of recipes, with plugin-owned sections filled in from the installed plugins."""

from __future__ import annotations

import json
from pathlib import Path

from edgebuild.errors import UsageError
from edgebuild.first_party import DISTRIBUTIONS, NAMES, install_command
from edgebuild.recipe.model import Recipe

# Distributions of this repository. The committed schema covers these, so it does not change
# with whatever else is installed; `edgebuild schema --installed` covers every plugin.
FIRST_PARTY = {"edgebuild", *NAMES}
TITLE = "edgebuild recipe"
# which plugin-owned sections a schema describes ({"coreml:compression": "edgebuild-coreml"}), so
# that a schema written in an install lacking some of their plugins is not taken for a whole one
SECTIONS_KEY = "x-edgebuild-sections"


def section_title(name: str) -> str:
    """The ``$defs`` name of a plugin-owned section: ``coreml:compression`` -> ``coreml_compression``."""
    owner, _, path = name.partition(":")
    return f"{owner}_{path.replace('.', '_')}"


def recipe_schema(registry=None, *, installed: bool = False) -> dict:
    schema = Recipe.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = TITLE
    if registry is None:
        return schema
    props = schema["properties"]
    defs = schema.setdefault("$defs", {})
    compression, sections = [], {}
    for name in sorted(registry.names("recipe_sections")):
        path = name.partition(":")[2]
        plugin = registry.plugin_of("recipe_sections", name)
        if not installed and (plugin is None or plugin.distribution not in FIRST_PARTY):
            continue
        model = registry.get("recipe_sections", name)
        sub = model.model_json_schema(by_alias=True, ref_template="#/$defs/{model}")
        defs.update(sub.pop("$defs", {}))
        defs[section_title(name)] = sub
        sections[name] = plugin.distribution if plugin is not None else None
        ref = {"$ref": f"#/$defs/{section_title(name)}"}
        if path == "compression":
            compression.append(ref)
    if compression:
        props["compression"] = {"anyOf": [*compression, {"type": "null"}],
                                "description": "weight compression, validated by the target backend's plugin"}
    schema[SECTIONS_KEY] = sections
    return schema


def schema_text(registry, *, installed: bool = False) -> str:
    """What ``edgebuild schema`` writes (``make schema``: the committed schemas/recipe.schema.json)."""
    return json.dumps(recipe_schema(registry, installed=installed), indent=2, sort_keys=True) + "\n"


def sections_of(schema: dict) -> dict[str, str | None]:
    """The plugin-owned sections a schema describes, each with the distribution that provides it."""
    recorded = schema.get(SECTIONS_KEY)
    if isinstance(recorded, dict):
        return recorded
    defs = schema.get("$defs") if isinstance(schema.get("$defs"), dict) else {}
    # written before the sections were recorded: the first-party ones it has definitions for
    return {name: d.name for d in DISTRIBUTIONS for name in d.recipe_sections if section_title(name) in defs}


def check_replace(path: Path, text: str, registry) -> None:
    """Refuse to replace ``path`` with the schema ``text`` when that would drop sections the file
    describes (their plugins are not installed here), or when the file is no recipe schema."""
    if not path.exists():
        return
    if path.is_dir():
        raise UsageError(f"--out {path}: is a directory; give the path of a .json file to write")
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        old = exc
    if not isinstance(old, dict) or old.get("title") != TITLE:
        raise UsageError(f"--out {path}: the file is not a recipe schema edgebuild wrote; it would be replaced",
                         hint="give another path, or pass --force to replace it")
    produced = json.loads(text)[SECTIONS_KEY]
    lost = {name: dist for name, dist in sections_of(old).items() if name not in produced}
    if not lost:
        return
    listed = ", ".join(f"{name} ({dist or 'an unknown plugin'})" for name, dist in sorted(lost.items()))
    first_party = [d for d in DISTRIBUTIONS if d.name in set(lost.values())]
    ways = [f"install {', '.join(d.name for d in first_party)} with `{install_command(*first_party)}` "
            "(from a checkout)"] if first_party else []
    if any(name in registry.names("recipe_sections") for name in lost):
        ways.append("add --installed to include third-party plugins' sections")
    ways.append("pass --force to write the schema without them")
    raise UsageError(f"--out {path}: the file describes recipe sections whose plugins are not installed: {listed}; "
                     "writing it would drop them", hint="; or ".join(ways))
