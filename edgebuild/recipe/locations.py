"""YAML loading that remembers where every value came from (file:line:column).

PyYAML's safe composer gives nodes with marks; we walk them once to map each dotted path
to its position, then build plain data with ``yaml.safe_load`` semantics (no object
construction, so a recipe can never run code).

A recipe is small, so the loader refuses what only a mistake or an attack produces: a file
over ``MAX_FILE_BYTES``, nesting deeper than ``MAX_DEPTH``, and aliases that expand to more
than ``MAX_VALUES`` values (a "billion laughs" file is a few hundred bytes that expand to
gigabytes). The limits are checked on the parser's event stream, before anything is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from edgebuild.errors import RecipeError

Path_ = tuple  # a path into the data: ("compression", "weights", "nbits")

MAX_FILE_BYTES = 4 * 1024 * 1024  # a recipe is a few KB; this leaves room for literal input values
MAX_DEPTH = 32  # mappings and lists inside each other, aliases expanded
MAX_VALUES = 100_000  # scalars, mappings and lists in the document, aliases expanded


@dataclass(frozen=True)
class Location:
    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


def _where(display: str, mark) -> str:
    return f"{display}:{mark.line + 1}:{mark.column + 1}"


def _read(path: Path, display: str) -> str:
    if path.is_dir():
        raise RecipeError(f"{display}: is a directory, not a recipe file",
                          hint=f"name the recipe inside it, e.g. {display.rstrip('/')}/recipe.yaml")
    try:
        if path.exists() and not path.is_file():
            raise RecipeError(f"{display}: not a regular file", hint="give the path of a recipe .yaml file")
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise RecipeError(f"{display}: {size / 1e6:.1f} MB is too large for a recipe "
                              f"(limit {MAX_FILE_BYTES // (1024 * 1024)} MiB)",
                              hint="is this the right file? keep large input values in .npy files (validate.inputs.NAME.file)")
        with open(path, "rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise RecipeError(f"{display}: no such file") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise RecipeError(f"{display}:{line}:{column} not UTF-8 text ({exc.reason})",
                          hint="save the recipe as UTF-8") from None
    except PermissionError:
        raise RecipeError(f"{display}: permission denied", hint="make the recipe readable") from None


def check_size(text: str, display: str) -> None:
    """Refuse documents nested deeper than MAX_DEPTH or expanding to more than MAX_VALUES values.

    One pass over the parser's events (the parser is a state machine: no recursion, so a deep
    document cannot overflow the stack here). Each anchored node's expanded size and depth is
    remembered, so an alias costs what it expands to, and is reported where it is used.
    """
    total = 0
    stack: list[list] = []  # open collections: [anchor, expanded size, deepest expanded depth below]
    anchors: dict[str, tuple[int, int]] = {}  # anchor -> (expanded size, depth)

    def close(anchor, size: int, depth: int) -> None:
        if anchor is not None:
            anchors[anchor] = (size, depth)
        if stack:
            stack[-1][1] += size
            stack[-1][2] = max(stack[-1][2], depth + 1)

    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                if event.anchor not in anchors:
                    open_anchors = {entry[0] for entry in stack}
                    problem = ("refers to the collection it is part of (a recursive structure)"
                               if event.anchor in open_anchors else "is not defined before this point")
                    raise RecipeError(f"{_where(display, event.start_mark)} invalid YAML: alias *{event.anchor} {problem}")
                size, depth = anchors[event.anchor]
                total += size
                if total > MAX_VALUES:
                    raise RecipeError(
                        f"{_where(display, event.start_mark)} the recipe expands to more than {MAX_VALUES:,} values "
                        f"through YAML aliases (*{event.anchor})",
                        hint="a recipe needs only a few hundred values; remove the aliases that copy large parts")
                if len(stack) + depth > MAX_DEPTH:
                    raise RecipeError(
                        f"{_where(display, event.start_mark)} the recipe nests deeper than {MAX_DEPTH} levels "
                        f"through YAML aliases (*{event.anchor})")
                close(None, size, depth)
            elif isinstance(event, (yaml.ScalarEvent, yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                total += 1
                if total > MAX_VALUES:
                    raise RecipeError(f"{_where(display, event.start_mark)} the recipe has more than {MAX_VALUES:,} values",
                                      hint="keep large input values in .npy files (validate.inputs.NAME.file)")
                if isinstance(event, yaml.ScalarEvent):
                    close(event.anchor, 1, 0)
                else:
                    if len(stack) >= MAX_DEPTH:
                        raise RecipeError(f"{_where(display, event.start_mark)} the recipe nests deeper than {MAX_DEPTH} levels")
                    stack.append([event.anchor, 1, 0])
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                anchor, size, depth = stack.pop()
                close(anchor, size, depth)
    except yaml.YAMLError:
        return  # the composer below reports syntax errors with their location


def load_yaml(path: Path, display: str) -> tuple[object, dict[Path_, Location]]:
    """Parse ``path`` safely; return the data and a map from data path to location."""
    text = _read(path, display)
    check_size(text, display)
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = _where(display, mark) if mark else display
        raise RecipeError(f"{where} invalid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"{display}: invalid YAML: {exc}") from None
    finally:
        loader.dispose()
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
