"""``matrix:``: axes of choices expanded into variants, one per combination, as a CI matrix does.

::

    matrix:
      precision: [float16, float32]       # target.precision
      chips: [m1, m3]                     # compute.chip
      compression:                        # named compression sections (null: none)
        none: null
        int8: {mode: linear, dtype: int8}
      exclude:
        - {precision: float32, compression: int8}

makes ``fp16-m1-none``, ``fp16-m1-int8``, ... ``fp32-m3-none``. A variant's name joins one value
name per axis: the built-in axes first, in the order of ``AXIS_ORDER`` (so names read the same
however the section is written), then any other axis in the order written. Another axis maps
value names to overrides of the whole recipe (``size: {small: {source: {inputs: ...}}}``).

``edgebuild run --matrix AXIS=V1,V2`` narrows (or, for the list axes, sets) an axis for one run.
Each combination is an ordinary variant: its stages share the store with every other variant, so
an axis changes only the stages that read what it sets (a chip axis: the backend's, not import or
optimize).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from edgebuild.errors import RecipeError, UsageError
from edgebuild.recipe.locations import locate

# axes whose values are a list, each setting one recipe field; the name part of a value
LIST_AXES = {
    "precision": ("target", "precision"),
    "deployment_targets": ("target", "deployment_target"),
    "chips": ("compute", "chip"),
}
SHORT_NAMES = {"float16": "fp16", "float32": "fp32"}
LONG_NAMES = {short: long for long, short in SHORT_NAMES.items()}
# axes whose values are named, each the whole section at this path (null: the section left out)
SECTION_AXES = {"compression": ("compression",)}
AXIS_ORDER = ("precision", "deployment_targets", "chips", "compression")
EXCLUDE = "exclude"
MAX_COMBINATIONS = 1024  # each is a build; more is a typo or a job for several recipes


@dataclass
class Cell:
    """One combination: its variant name, the overrides it makes, where each came from."""

    name: str
    override: dict
    locations: dict = field(default_factory=dict)  # override path -> location in the matrix section
    choices: dict = field(default_factory=dict)  # axis -> value name


@dataclass
class _Value:
    name: str  # as it appears in the variant name
    written: str  # as written in the recipe (what exclude: and --matrix match)
    override: dict
    locations: dict


def parse_axes(texts: list[str] | None) -> dict[str, list[str]]:
    """``--matrix chips=m1,m3`` (repeatable) as ``{"chips": ["m1", "m3"]}``."""
    axes: dict[str, list[str]] = {}
    for text in texts or []:
        axis, sep, values = text.partition("=")
        axis = axis.strip()
        names = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not axis or not names:
            raise UsageError(f"--matrix {text!r}: give AXIS=VALUE[,VALUE...]", hint="e.g. --matrix chips=m1,m3")
        if axis == EXCLUDE:
            raise UsageError(f"--matrix {text!r}: exclude is not an axis; write exclusions in the recipe's matrix:")
        if axis in axes:
            raise UsageError(f"--matrix {axis}= is given twice; give all its values once, comma-separated")
        axes[axis] = names
    return axes


def expand(matrix, locations: dict, *, given: dict[str, list[str]] | None = None,
           explicit: dict | None = None, display: str = "recipe") -> list[Cell]:
    """The variants a ``matrix:`` section makes, ``given`` (from ``--matrix``) applied; checked
    against each other and the ``explicit`` variants' names. Errors carry file:line."""
    if matrix is None:
        matrix = {}
    where = locate(locations, ("matrix",)) or display
    if not isinstance(matrix, dict):
        raise RecipeError(f"{where} matrix: must map axis names (precision, chips, compression, ...) to values")
    axes = {axis: _values(axis, spec, locations, where) for axis, spec in matrix.items() if axis != EXCLUDE}
    excluded = _exclusions(matrix.get(EXCLUDE), axes, locations, where)  # against the recipe's own values
    axes = _apply_given(axes, given or {}, display)
    if not axes:
        return []
    order = [a for a in AXIS_ORDER if a in axes] + [a for a in axes if a not in AXIS_ORDER]
    cells, seen = [], {}
    combinations = 1
    for axis in order:
        combinations *= len(axes[axis])
    if combinations > MAX_COMBINATIONS:
        raise RecipeError(f"{where} matrix: {combinations} combinations; at most {MAX_COMBINATIONS}",
                          hint="split the recipe, or narrow an axis for this run with --matrix AXIS=V1,V2")
    for combo in itertools.product(*(axes[a] for a in order)):
        choices = dict(zip(order, combo))
        if any(all(_matches(choices[a], wanted) for a, wanted in rule.items()) for rule in excluded):
            continue
        name = "-".join(v.name for v in combo)
        override, cell_locations = {}, {}
        for value in combo:
            override = _merged(override, value.override)
            cell_locations.update(value.locations)
        if name in seen:
            raise RecipeError(f"{where} matrix: two combinations are both named {name!r} "
                              f"({_described(seen[name])} and {_described(choices)})",
                              hint="rename a value so the joined names differ")
        seen[name] = choices
        cells.append(Cell(name, override, cell_locations, {a: v.written for a, v in choices.items()}))
    if not cells:
        raise RecipeError(f"{where} matrix: exclude: leaves out every combination; nothing to build")
    for cell in cells:
        if cell.name in (explicit or {}):
            variant_at = locate(locations, ("variants", cell.name), key=True) or display
            raise RecipeError(f"{where} matrix: makes a variant named {cell.name!r} ({_described(cell.choices)}), "
                              f"which variants: defines too (at {variant_at})",
                              hint="rename the explicit variant, or drop it and let the matrix build it")
    return cells


def _values(axis, spec, locations: dict, where) -> list[_Value]:
    at = locate(locations, ("matrix", axis)) or where
    if not isinstance(axis, str):
        raise RecipeError(f"{at} matrix: an axis name is text; YAML read {axis!r}", hint=f"quote it: '{axis}'")
    if axis in LIST_AXES:
        if not isinstance(spec, list) or not spec:
            raise RecipeError(f"{at} matrix.{axis}: give a list of at least one value, e.g. "
                              f"{_example(axis)}")
        values = []
        for i, item in enumerate(spec):
            if not isinstance(item, str):
                raise RecipeError(f"{locate(locations, ('matrix', axis, i)) or at} matrix.{axis}[{i}]: "
                                  f"{item!r} is not text", hint=f"quote it: '{item}'")
            values.append(_list_value(axis, item, locate(locations, ("matrix", axis, i)) or at))
        return _unique(axis, values, at)
    if not isinstance(spec, dict) or not spec:
        kinds = ", ".join(LIST_AXES)
        raise RecipeError(f"{at} matrix.{axis}: give a mapping of value names to overrides "
                          f"(only {kinds} take a list)")
    values = []
    for name, override in spec.items():
        value_at = locate(locations, ("matrix", axis, name), key=True) or at
        if not isinstance(name, str):
            raise RecipeError(f"{value_at} matrix.{axis}: a value name is text; YAML read {name!r}",
                              hint=f"quote it: '{name}'")
        prefix = SECTION_AXES.get(axis, ())
        if prefix:
            if override is not None and not isinstance(override, dict):
                raise RecipeError(f"{value_at} matrix.{axis}.{name}: give the {'.'.join(prefix)} section "
                                  "(a mapping), or null for none")
        elif override is not None and not isinstance(override, dict):
            raise RecipeError(f"{value_at} matrix.{axis}.{name}: give the overrides this value makes (a mapping)")
        elif override and ({"variants", "matrix", "extends"} & set(override)):
            raise RecipeError(f"{value_at} matrix.{axis}.{name}: a matrix value cannot set variants, matrix "
                              "or extends")
        source = ("matrix", axis, name)
        found = {prefix + p[len(source):]: loc for p, loc in locations.items()
                 if p[:len(source)] == source and p != source + ("<key>",)}
        if prefix:  # (the root's location stays the recipe's)
            found[prefix] = locate(locations, source) or value_at
        values.append(_Value(name, name, _nest(prefix, override) if prefix else dict(override or {}), found))
    return _unique(axis, values, at)


def _list_value(axis: str, item: str, at) -> _Value:
    path = LIST_AXES[axis]
    name = SHORT_NAMES.get(item, item) if axis == "precision" else item.lower() if axis == "deployment_targets" else item
    return _Value(name, item, _nest(path, item), {path: at})


def _unique(axis: str, values: list[_Value], at) -> list[_Value]:
    names = [v.name for v in values]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise RecipeError(f"{at} matrix.{axis}: {twice[0]!r} is listed twice")
    return values


def _apply_given(axes: dict, given: dict[str, list[str]], display: str) -> dict:
    """``--matrix`` on top of the recipe: a list axis takes the values given; a named axis keeps
    only the values named."""
    axes = dict(axes)
    for axis, wanted in given.items():
        if axis in LIST_AXES:
            if axis == "precision":
                wanted = [LONG_NAMES.get(item, item) for item in wanted]
                unknown = [item for item in wanted if item not in SHORT_NAMES]
                if unknown:
                    raise UsageError(f"--matrix precision=: {unknown[0]!r} is not a precision; "
                                     "give float16 (fp16) or float32 (fp32)")
            axes[axis] = [_list_value(axis, item, None) for item in wanted]
            continue
        if axis not in axes:
            known = ", ".join(sorted(set(axes) | set(LIST_AXES)))
            raise UsageError(f"--matrix {axis}=: {display} has no matrix axis {axis!r} (axes: {known})",
                             hint=f"a named axis ({axis}: {{NAME: overrides}}) must be in the recipe's matrix:")
        unknown = [w for w in wanted if not any(_matches(v, w) for v in axes[axis])]
        if unknown:
            raise UsageError(f"--matrix {axis}=: {display}'s matrix.{axis} has no value {unknown[0]!r} "
                             f"(it has {', '.join(v.written for v in axes[axis])})")
        axes[axis] = [v for v in axes[axis] if any(_matches(v, w) for w in wanted)]
    return axes


def _exclusions(rules, axes: dict, locations: dict, where) -> list[dict]:
    if rules is None:
        return []
    at = locate(locations, ("matrix", EXCLUDE)) or where
    if not isinstance(rules, list):
        raise RecipeError(f"{at} matrix.exclude: give a list of {{axis: value}} mappings, "
                          "e.g. [{precision: float32, chips: a17}]")
    checked = []
    for i, rule in enumerate(rules):
        rule_at = locate(locations, ("matrix", EXCLUDE, i)) or at
        if not isinstance(rule, dict) or not rule:
            raise RecipeError(f"{rule_at} matrix.exclude[{i}]: give a mapping of axis to value, "
                              "e.g. {precision: float32, chips: a17}")
        for axis, wanted in rule.items():
            key_at = locate(locations, ("matrix", EXCLUDE, i, axis), key=True) or rule_at
            if axis not in axes:
                raise RecipeError(f"{key_at} matrix.exclude[{i}]: no axis {axis!r} "
                                  f"(axes: {', '.join(map(str, axes))})")
            if not any(_matches(v, str(wanted)) for v in axes[axis]):
                value_at = locate(locations, ("matrix", EXCLUDE, i, axis)) or rule_at
                raise RecipeError(f"{value_at} matrix.exclude[{i}].{axis}: {wanted!r} is not one of "
                                  f"{', '.join(v.written for v in axes[axis])}")
        checked.append({axis: str(wanted) for axis, wanted in rule.items()})
    return checked


def _matches(value: _Value, wanted: str) -> bool:
    return wanted in (value.name, value.written)


def _described(choices: dict) -> str:
    return ", ".join(f"{axis}={v.written if isinstance(v, _Value) else v}" for axis, v in choices.items())


def _example(axis: str) -> str:
    return {"precision": "[float16, float32]", "deployment_targets": "[iOS17, iOS18]"}.get(axis, "[m1, m3, a17]")


def _nest(path: tuple, value) -> dict:
    for key in reversed(path):
        value = {key: value}
    return value


def _merged(base: dict, override: dict) -> dict:
    """Axes' overrides combined; a later axis refines what an earlier one set, key by key."""
    from edgebuild.recipe.merge import deep_merge

    return deep_merge(base, override)
