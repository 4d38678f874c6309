"""``source.options.factory``: a ``'package.module:callable'`` a frontend calls to build the model."""

from __future__ import annotations

import importlib
import re
from typing import Any, Callable, Optional

from edgebuild.errors import BuildError

FACTORY_PATTERN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def check_factory_spelling(value: Optional[str]) -> Optional[str]:
    """A pydantic field validator's body: ``value`` unchanged, or ValueError when it is not
    ``'package.module:callable'``."""
    if value is not None and not FACTORY_PATTERN.match(value):
        raise ValueError(f"{value!r} is not 'package.module:callable'")
    return value


def resolve_factory(spec: str) -> Callable:
    """The callable ``spec`` names, imported; a BuildError naming the factory when it cannot be."""
    module_name, _, attribute = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise BuildError(f"source.options.factory {spec!r}: cannot import {module_name!r} ({type(exc).__name__}: "
                         f"{first})", hint="install the package that provides the model, or fix the factory path") \
            from exc
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise BuildError(f"source.options.factory {spec!r}: {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise BuildError(f"source.options.factory {spec!r}: {attribute!r} is not callable")
    return target
