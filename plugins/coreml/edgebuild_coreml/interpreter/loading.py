"""Import every ``ops_*`` module of this package so their ``@evaluates`` run.

Discovery by name lets each op family live in its own module without a central list that
every author would have to edit.
"""

from __future__ import annotations

import importlib
import pkgutil

_loaded = False


def load_evaluators() -> None:
    """Import all evaluator modules once; later calls are free."""
    global _loaded
    if _loaded:
        return
    package = __name__.rpartition(".")[0]
    package_path = importlib.import_module(package).__path__
    for module in sorted(pkgutil.iter_modules(package_path), key=lambda m: m.name):
        if module.name.startswith("ops_"):
            importlib.import_module(f"{package}.{module.name}")
    _loaded = True
