"""Turn pydantic validation errors into ``file:line:col dotted.path: message`` lines."""

from __future__ import annotations

import difflib
import typing

from pydantic import BaseModel, ValidationError

from edgebuild.errors import RecipeError
from edgebuild.recipe.locations import locate


def _clean_path(loc: tuple, data) -> tuple:
    """Drop pydantic's union-member tags from ``loc``, keeping only keys present in the data.

    A tagged union puts the tag in the path (``weights.palettize.nbits`` for
    ``weights: {mode: palettize, nbits: 5}``); the user's path is ``weights.nbits``.
    """
    path, node = [], data
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(node, dict) and part in node:
            path.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            path.append(part)
            node = node[part]
        elif not last and isinstance(node, dict) and _is_discriminator_value(part, node):
            continue  # the tag of a discriminated union: the value of the node's "mode" (say)
        elif isinstance(node, dict) and isinstance(part, str) and not path_is_tag(part):
            path.append(part)  # a missing or unknown key
            node = None
    return tuple(path)


def _is_discriminator_value(part, node: dict) -> bool:
    return isinstance(part, str) and any(isinstance(v, str) and v == part for v in node.values())


def path_is_tag(part: str) -> bool:
    return (part[:1].isupper() or part in {"int", "str", "float", "bool", "list[int]", "dict[str,any]"}
            or part.startswith("constrained-") or "[" in part)


def _model_at(model: type[BaseModel], path: tuple):
    """The pydantic model class that validates the mapping at ``path``, if there is one."""
    annotation = model
    for part in path:
        annotation = _unwrap(annotation, part)
        if annotation is None:
            return None
    annotation = _unwrap_model(annotation)
    return annotation


def _unwrap_model(annotation):
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _unwrap_model(arg)
        if found is not None:
            return found
    return None


def _unwrap(annotation, part):
    model = _unwrap_model(annotation) if not isinstance(part, int) else None
    if model is not None and isinstance(part, str):
        for name, field in model.model_fields.items():
            if part in (name, field.alias):
                return field.annotation
        return None
    for arg in typing.get_args(annotation) or ():
        origin = typing.get_origin(arg) or arg
        if origin in (list, tuple) and isinstance(part, int):
            return typing.get_args(arg)[0]
        if origin is dict:
            return typing.get_args(arg)[1]
    origin = typing.get_origin(annotation)
    if origin in (list, tuple) and isinstance(part, int):
        return typing.get_args(annotation)[0]
    if origin is dict:
        return typing.get_args(annotation)[1]
    return None


def valid_keys(model: type[BaseModel], path: tuple) -> list[str]:
    found = _model_at(model, path)
    if found is None:
        return []
    return [field.alias or name for name, field in found.model_fields.items()]


def _message(error: dict, path: tuple, model: type[BaseModel]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        keys = valid_keys(model, path[:-1])
        close = difflib.get_close_matches(str(path[-1]), keys, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else (f"; valid keys: {', '.join(keys)}" if keys else "")
        return f"unknown key {path[-1]!r}{hint}"
    if kind == "missing":
        return "required key is missing"
    if kind in ("literal_error", "union_tag_invalid"):
        ctx = error.get("ctx", {})
        expected = ctx.get("expected") or ctx.get("expected_tags") or ""
        choices = [c.strip().strip("'") for c in expected.replace(" or ", ", ").split(",")]
        given = ctx.get("tag", error.get("input"))
        return "must be one of " + ", ".join(choices) + _closest(given, choices)
    message = error["msg"]
    message = message.removeprefix("Value error, ")
    return message[:1].lower() + message[1:]


def _closest(given, choices: list[str]) -> str:
    """``; did you mean 'x'?`` when ``given`` is a near miss of one of ``choices``."""
    if not isinstance(given, str):
        return ""
    lower = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(given.lower(), list(lower), n=1, cutoff=0.6)
    return f"; did you mean {lower[close[0]]!r}?" if close else ""


def format_errors(
    exc: ValidationError, data, locations: dict, model: type[BaseModel], prefix: tuple = ()
) -> RecipeError:
    """One RecipeError whose message has a line per distinct problem, most specific first."""
    errors = []
    for error in exc.errors(include_url=False):
        raw = tuple(error["loc"])
        if error["type"] == "union_tag_invalid":  # the tag's own key is what is wrong
            raw += (error.get("ctx", {}).get("discriminator", "").strip("'"),)
        path = _clean_path(raw, data)
        errors.append((path, error, len(path) < len([p for p in raw if not (isinstance(p, str) and path_is_tag(p))])
                       or any(isinstance(p, str) and path_is_tag(p) for p in raw)))
    errors = _prefer_matching_branch(_drop_misfit_branches(errors))
    lines, seen = [], set()
    for path, error, _ in errors:
        full = prefix + path
        if full in seen:
            continue
        seen.add(full)
        where = locate(locations, full, key=error["type"] == "extra_forbidden")
        dotted = ".".join(str(p) for p in full) or "<recipe>"
        lines.append(f"{where or '<recipe>'} {dotted}: {_message(error, path, model)}")
    return RecipeError("\n".join(lines))


# errors saying a value has the wrong shape for a union member, rather than a wrong value
_MISFIT = {"extra_forbidden", "missing", "model_type", "model_attributes_type", "dict_type", "int_type",
           "int_parsing", "string_type", "float_type", "float_parsing", "bool_type", "bool_parsing",
           "list_type", "tuple_type", "none_required"}


def _drop_misfit_branches(errors: list) -> list:
    """For a value that fits one member of a union (``{range: [64, 1]}`` is a RangeDim, not an
    EnumeratedDim or an int), drop the members it does not fit and keep what is wrong with the
    one it does."""
    branches: dict[tuple, dict[str, bool]] = {}  # union site -> {member: fits}
    tagged = []
    for path, error, in_union in errors:
        loc = tuple(error["loc"])
        tags = [i for i, p in enumerate(loc) if isinstance(p, str) and path_is_tag(p)]
        site = (loc[: tags[-1]], loc[tags[-1]]) if tags else None
        tagged.append(site)
        if site is not None:
            fits = branches.setdefault(site[0], {}).setdefault(site[1], True)
            branches[site[0]][site[1]] = fits and error["type"] not in _MISFIT
    keep = []
    for (path, error, in_union), site in zip(errors, tagged):
        if site is not None and any(branches[site[0]].values()) and not branches[site[0]][site[1]]:
            continue
        keep.append((path, error, in_union))
    return keep


def _prefer_matching_branch(errors: list) -> list:
    """For a value that may take several shapes (a union), keep the error of the shape the user
    evidently meant: the deepest one, not a 'missing key' of a shape they did not write."""
    union = [e for e in errors if e[2]]
    keep = []
    for path, error, in_union in errors:
        if in_union:
            deeper = any(p[: len(path)] == path and len(p) > len(path) for p, _, _ in union)
            sibling = error["type"] == "missing" and any(
                p[: len(path) - 1] == path[:-1] and e["type"] != "missing" and len(p) >= len(path) for p, e, _ in union)
            if deeper or sibling:
                continue
        keep.append((path, error, in_union))
    return keep
