"""The MPSGraph lowerings this plugin provides, collected by decorator and registered
with edgebuild's registry (backend ``mpsgraph``) by ``plugin.py``."""

from __future__ import annotations

from typing import Callable

LOWERINGS: list[tuple[str, str, int, int | None, Callable]] = []  # (domain, op_type, since, until, fn)


def lowers(*op_types: str, domain: str = "", since: int = 1, until: int | None = None):
    def decorate(fn: Callable) -> Callable:
        for op_type in op_types:
            LOWERINGS.append((domain, op_type, since, until, fn))
        return fn

    return decorate
