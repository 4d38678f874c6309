"""``optimize.passes`` against the installed graph passes: which names exist, and each switch.

The recipe model checks that every switch is a boolean; which names exist and what a pass does
when the recipe leaves it out are the registry's. Both are read here and nowhere else: the load
check (``checks.py``) refuses an unknown name at its file:line, and the optimize stage's
parameters are built with ``pass_switches``, so the stage neither checks nor defaults a pass.

A pass runs by default from the lowest ``optimize.level`` it declares (its ``level``); a pass that
declares none keeps what ``default`` said before levels existed: on from O2, or only at O3.
"""

from __future__ import annotations

from typing import Mapping

from edgebuild.errors import PluginError
from edgebuild.recipe.model import OPTIMIZE_LEVELS
from edgebuild.registration import Lazy

DEFAULT_LEVEL = "O2"  # the build a recipe that names no level gets: every pass's ``default``


def unknown_passes(chosen: Mapping[str, bool], registry) -> list[str]:
    """The names in ``chosen`` no installed plugin registered as a pass, in the recipe's order."""
    known = set(registry.names("passes"))
    return [name for name in chosen if name not in known]


def installed_passes(registry) -> str:
    """The installed passes' names, for a message: ``"a, b"`` or ``"none"``."""
    return ", ".join(sorted(map(str, registry.names("passes")))) or "none"


def pass_level(graph_pass, name: str = "") -> str:
    """The lowest optimize level ``graph_pass`` runs at unless the recipe switches it.

    A lazily registered pass is asked its level only if its registration said it
    (``Lazy.known(level=...)``): asking it anything else would import it, and planning a build
    imports no pass that declared its ``default``."""
    if isinstance(graph_pass, Lazy):
        known = graph_pass.known_attributes()
        declared = known.get("level")
        default = known["default"] if "default" in known else graph_pass.default
    else:
        declared, default = getattr(graph_pass, "level", None), getattr(graph_pass, "default", True)
    if declared is None:
        return DEFAULT_LEVEL if default else OPTIMIZE_LEVELS[-1]
    if declared not in OPTIMIZE_LEVELS:
        raise PluginError(f"graph pass {name!r} declares level {declared!r}, not one of {', '.join(OPTIMIZE_LEVELS)}",
                          hint="set the pass's level to the lowest optimize.level it should run at")
    return declared


def runs_at(graph_pass, level: str, name: str = "") -> bool:
    """Whether ``graph_pass`` is on at ``level`` when the recipe does not switch it."""
    return OPTIMIZE_LEVELS.index(pass_level(graph_pass, name)) <= OPTIMIZE_LEVELS.index(level)


def pass_switches(chosen: Mapping[str, bool], registry, level: str = DEFAULT_LEVEL) -> dict[str, bool]:
    """Every installed pass, in registration order, on or off: as the recipe says, else as its
    level says at the recipe's ``optimize.level``. The one place a pass's default is read."""
    return {name: bool(chosen[name]) if name in chosen else runs_at(entry.obj, level, name)
            for name, entry in registry.tables["passes"].items()}


def passes_by_level(registry) -> dict[str, list[str]]:
    """The installed passes by the level they start at, in registration order."""
    levels: dict[str, list[str]] = {level: [] for level in OPTIMIZE_LEVELS}
    for name, entry in registry.tables["passes"].items():
        levels[pass_level(entry.obj, name)].append(name)
    return levels
