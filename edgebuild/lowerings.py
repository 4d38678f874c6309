"""A helper for plugins that provide op lowerings: declare each with a decorator in its
own small module, then register them all with one call from the plugin's hook::

    LOWERINGS = LoweringSet("coreml")

    @LOWERINGS.lowers("Relu")
    def relu(ctx, node): ...

    @hookimpl
    def edgebuild_register_lowerings(register):
        import my_plugin.ops  # noqa: F401  (modules that declare lowerings)
        LOWERINGS.register_all(register)
"""

from __future__ import annotations

from typing import Callable


class LoweringSet:
    def __init__(self, backend: str):
        self.backend = backend
        self.entries: list[tuple[str, str, int, int | None, Callable]] = []  # (domain, op, since, until, fn)

    def lowers(self, *op_types: str, domain: str = "", since: int = 1, until: int | None = None):
        """Declare the decorated function as the lowering of ``op_types`` for opsets ``[since, until]``."""

        def decorate(fn: Callable) -> Callable:
            for op_type in op_types:
                self.entries.append((domain, op_type, since, until, fn))
            return fn

        return decorate

    def register_all(self, register) -> None:
        for domain, op_type, since, until, fn in self.entries:
            register(self.backend, op_type, fn, domain=domain, since=since, until=until)

    def __iter__(self):
        return iter(self.entries)
