"""YAML loading that remembers where every value came from (file:line:column).

PyYAML's safe composer gives nodes with marks; we walk them once to map each dotted path
to its position, then build plain data with ``yaml.safe_load`` semantics (no object
construction, so a recipe can never run code).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from edgebuild.errors import RecipeError

Path_ = tuple  # a path into the data: ("compression", "weights", "nbits")


@dataclass(frozen=True)
class Location:
    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


def load_yaml(path: Path, display: str) -> tuple[object, dict[Path_, Location]]:
    """Parse ``path`` safely; return the data and a map from data path to location."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError(f"{display}: no such file") from None
    except UnicodeDecodeError as exc:
        raise RecipeError(f"{display}: not UTF-8 text ({exc.reason})") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.load(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{display}:{mark.line + 1}:{mark.column + 1}" if mark else display
        raise RecipeError(f"{where} invalid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"{display}: invalid YAML: {exc}") from None
    locations: dict[Path_, Location] = {}
    if node is not None:
        _walk(node, (), display, locations)
    return data, locations


def _walk(node, path: Path_, display: str, out: dict) -> None:
    out[path] = Location(display, node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict = {}
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                raise RecipeError(
                    f"{display}:{key_node.start_mark.line + 1}:{key_node.start_mark.column + 1} "
                    f"{'.'.join(map(str, path + (key,)))}: duplicate key (first at line {seen[key]})"
                )
            seen[key] = key_node.start_mark.line + 1
            # an unknown key is reported at the key itself, a bad value at the value
            out[path + (key, "<key>")] = Location(display, key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            _walk(value_node, path + (key,), display, out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, path + (index,), display, out)


def locate(locations: dict[Path_, Location], path: Path_, *, key: bool = False) -> Location | None:
    """The most specific known location for ``path`` (falls back to its nearest ancestor)."""
    if key and path + ("<key>",) in locations:
        return locations[path + ("<key>",)]
    for end in range(len(path), -1, -1):
        found = locations.get(tuple(path[:end]))
        if found is not None:
            return found
    return None
