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


def check_size(text: str, display: str, *, loader=yaml.SafeLoader) -> None:
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
        for event in yaml.parse(text, Loader=loader):
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
        if loader is not yaml.SafeLoader:
            raise  # the pure-Python loader is asked again, for its message
        return  # the composer below reports syntax errors with their location


# libyaml, where PyYAML was built with it, parses ~10x faster (a recipe with thousands of
# variants); the pure-Python loader reports the errors, so messages are the same either way
FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MERGE_TAG = "tag:yaml.org,2002:merge"
# the C0 controls' names, for a message that says which byte it found
CONTROL_NAMES = ("NUL SOH STX ETX EOT ENQ ACK BEL BS HT LF VT FF CR SO SI DLE DC1 DC2 DC3 DC4 NAK SYN ETB "
                 "CAN EM SUB ESC FS GS RS US").split()


def check_characters(text: str, display: str) -> None:
    """Refuse a character YAML does not allow (NUL, other control characters), at its file:line:column."""
    found = yaml.reader.Reader.NON_PRINTABLE.search(text)
    if found is None:
        return
    char = found.group()
    line = text.count("\n", 0, found.start()) + 1
    column = found.start() - (text.rfind("\n", 0, found.start()) + 1) + 1
    code = ord(char)
    name = CONTROL_NAMES[code] if code < 32 else "DEL" if code == 127 else None
    what = f"the control character U+{code:04X} ({name})" if name else f"the character U+{code:04X}"
    raise RecipeError(f"{display}:{line}:{column} {what} is not allowed in YAML",
                      hint="remove it (an editor that shows invisible characters helps); to put such bytes "
                           "in a value, write it in double quotes with an escape, e.g. \"\\x00\"")


def load_yaml(path: Path, display: str) -> tuple[object, dict[Path_, Location]]:
    """Parse ``path`` safely; return the data and a map from data path to location."""
    text = _read(path, display)
    check_characters(text, display)
    try:
        check_size(text, display, loader=FAST_LOADER)
        return _compose(text, display, FAST_LOADER)
    except yaml.YAMLError:
        if FAST_LOADER is yaml.SafeLoader:
            raise
    check_size(text, display)
    return _compose(text, display, yaml.SafeLoader)  # raises the error with its message and location


def _compose(text: str, display: str, loader_class) -> tuple[object, dict[Path_, Location]]:
    loader = loader_class(text)
    try:
        node = loader.get_single_node()
        locations: dict[Path_, Location] = {}
        if node is not None:
            _walk(node, (), display, locations)  # before constructing: that folds merge keys into the node
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        if loader_class is not yaml.SafeLoader:
            raise
        mark = exc.problem_mark or exc.context_mark
        where = _where(display, mark) if mark else display
        raise RecipeError(f"{where} invalid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        if loader_class is not yaml.SafeLoader:
            raise
        raise RecipeError(f"{display}: invalid YAML: {exc}") from None
    finally:
        loader.dispose()
    return data, locations


def _walk(node, path: Path_, display: str, out: dict) -> None:
    out[path] = Location(display, node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict = {}
        merged = []
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_TAG:  # ``<<: *base``: its keys come in below the mapping's own
                merged.append(value_node)
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                continue  # a list or mapping as a key: construction refuses it with its location
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
        for source in merged:
            _walk_merged(source, path, display, out, seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, path + (index,), display, out)


def _walk_merged(source, path: Path_, display: str, out: dict, seen: dict) -> None:
    """Locations of the keys a merge key brings in: where the merged mapping wrote them, for the
    keys the mapping does not set itself (YAML: its own keys win, then earlier merged mappings)."""
    sources = source.value if isinstance(source, yaml.SequenceNode) else [source]
    for mapping in sources:
        if not isinstance(mapping, yaml.MappingNode):
            continue  # construction refuses a merge of anything but mappings, with its location
        found: dict = {}
        _walk(mapping, path, display, found)
        for key_path, location in found.items():
            if len(key_path) > len(path) and key_path[len(path)] not in seen:
                out[key_path] = location
        seen.update({p[len(path)]: 0 for p in found if len(p) > len(path)})


def locate(locations: dict[Path_, Location], path: Path_, *, key: bool = False) -> Location | None:
    """The most specific known location for ``path`` (falls back to its nearest ancestor)."""
    if key and path + ("<key>",) in locations:
        return locations[path + ("<key>",)]
    for end in range(len(path), -1, -1):
        found = locations.get(tuple(path[:end]))
        if found is not None:
            return found
    return None
