"""``optimize.passes`` against the installed graph passes: which names exist, and each switch.

The recipe model checks that every switch is a boolean; which names exist and what a pass does
when the recipe leaves it out are the registry's. Both are read here and nowhere else: the load
check (``checks.py``) refuses an unknown name at its file:line, and the optimize stage's
parameters are built with ``pass_switches``, so the stage neither checks nor defaults a pass.
"""

from __future__ import annotations

from typing import Mapping


def unknown_passes(chosen: Mapping[str, bool], registry) -> list[str]:
    """The names in ``chosen`` no installed plugin registered as a pass, in the recipe's order."""
    known = set(registry.names("passes"))
    return [name for name in chosen if name not in known]


def installed_passes(registry) -> str:
    """The installed passes' names, for a message: ``"a, b"`` or ``"none"``."""
    return ", ".join(sorted(map(str, registry.names("passes")))) or "none"


def pass_switches(chosen: Mapping[str, bool], registry) -> dict[str, bool]:
    """Every installed pass, in registration order, on or off: as the recipe says, else the
    pass's own ``default``. The one place a pass's default is read."""
    return {name: bool(chosen.get(name, entry.obj.default)) for name, entry in registry.tables["passes"].items()}
