"""How plugins register what they provide: lazy objects, op tables and lowering sets.

- :class:`Lazy` stands in for an object until it is first used, so registering a plugin
  imports none of the heavy libraries behind it.
- :class:`OpTable` holds one entry per (domain, op type, opset range) and refuses an entry
  whose range overlaps one it holds, naming both registrants. The core's table of lowerings
  is one; so are the op registries of the reference executors.
- :class:`LoweringSet` collects a plugin's lowerings by decorator, each module declaring its
  own, and registers them all from the plugin's hook::

    LOWERINGS = LoweringSet("coreml")

    @LOWERINGS.lowers("Relu")
    def relu(ctx, node): ...

    @LOWERINGS.lowers("Split", until=12)     # `split` an attribute
    def split_attribute(ctx, node): ...

    @LOWERINGS.lowers("Split", since=13)     # `split` an input
    def split_input(ctx, node): ...

    @hookimpl
    def edgebuild_register_lowerings(register):
        import my_plugin.ops  # noqa: F401  (modules that declare lowerings)
        LOWERINGS.register_all(register)

- :func:`unique_name` names a new value or tensor beside the ones a graph already has.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgebuild.errors import PluginError

STANDARD_DOMAINS = ("", "ai.onnx")


class Lazy:
    """Stands in for ``factory(*args, **kwargs)``, the factory named ``"package.module:Name"``,
    until an attribute is first read, so registering a plugin costs no import of the heavy
    libraries behind it (onnxscript, coremltools)."""

    def __init__(self, target: str, *args, **kwargs):
        self._target, self._args, self._kwargs, self._obj = target, args, kwargs, None
        self._checks: list = []

    def known(self, **attributes) -> "Lazy":
        """Answer ``attributes`` without importing the target: values read before the object is
        used (a graph pass's ``default``, read when a build plans its stages; a backend's
        ``default``, read to pick the backend of a recipe that names none)."""
        self.__dict__.update(attributes)
        self.__dict__.setdefault("_known", {}).update(attributes)
        return self

    def known_attributes(self) -> dict[str, Any]:
        return dict(self.__dict__.get("_known", {}))

    def _resolve(self):
        if self._obj is None:
            module, _, name = self._target.partition(":")
            factory = getattr(importlib.import_module(module), name)
            obj = factory(*self._args, **self._kwargs)
            for check in self._checks:
                check(obj)
            self._obj = obj
        return self._obj

    def when_loaded(self, check) -> None:
        """Run ``check(obj)`` on the object once it is made (the registry checks it against its protocol)."""
        self._checks.append(check)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._resolve(), name)

    def __repr__(self) -> str:
        return f"Lazy({self._target!r})"


def unique_name(base: str, taken: set[str], *, separator: str = "_", first: int = 2) -> str:
    """``base``, or ``base + separator + n`` for the first ``n`` from ``first`` up, whichever
    is not in ``taken``; the name returned is added to ``taken``."""
    candidate, n = base, first
    while candidate in taken:
        candidate = f"{base}{separator}{n}"
        n += 1
    taken.add(candidate)
    return candidate


def standard_domain(domain: str | None) -> str:
    """``""`` for the ONNX standard domain however it is spelled, any other unchanged."""
    return "" if domain in (*STANDARD_DOMAINS, None) else domain


@dataclass
class OpEntry:
    """``obj``, registered by ``owner`` for ``op_type`` in ``domain`` at opsets ``[since, until]``."""

    domain: str
    op_type: str
    since: int
    until: int | None  # None: every later opset
    obj: Any
    owner: str

    def covers(self, opset: int | None) -> bool:
        """Whether this entry applies at ``opset`` (None: the latest)."""
        if opset is None:
            return self.until is None
        return self.since <= opset and (self.until is None or opset <= self.until)

    def overlaps(self, other: "OpEntry") -> bool:
        return other.covers(self.since) or self.covers(other.since)

    @property
    def label(self) -> str:
        return f"{self.domain}::{self.op_type}" if self.domain else self.op_type

    @property
    def opsets(self) -> str:
        return f"{self.since}-{self.until or 'latest'}"


class OpTable:
    """Entries by (domain, op type) and opset range, at most one for any opset.

    ``what`` names an entry in errors (``"a coreml lowering"``); ``hint`` says how to resolve
    a clash. Tables whose ops have no versions (the ops of a backend's own format) register
    every entry with the default range and read it with ``table[op_type]``.
    """

    def __init__(self, what: str, *, hint: str = "register each op once per opset range"):
        self.what, self.hint = what, hint
        self._entries: dict[tuple[str, str], list[OpEntry]] = {}
        self._order: list[OpEntry] = []

    def add(self, op_type: str, obj, *, domain: str | None = "", since: int = 1, until: int | None = None,
            owner: str | None = None) -> OpEntry:
        """Hold ``obj`` for ``op_type`` at opsets ``[since, until]``; raises PluginError naming both
        registrants when a held entry's range overlaps. ``owner`` defaults to ``obj``'s name."""
        entry = OpEntry(standard_domain(domain), op_type, since, until, obj, owner or _name_of(obj))
        held_entries = self._entries.setdefault((entry.domain, op_type), [])
        for held in held_entries:
            if held.overlaps(entry):
                raise PluginError(
                    f"{entry.owner} registers {self.what} of {entry.label} for opsets {entry.opsets}, "
                    f"overlapping the one {held.owner} holds ({held.opsets})",
                    hint=self.hint,
                )
        held_entries.append(entry)
        self._order.append(entry)
        return entry

    def entry(self, op_type: str, *, domain: str | None = "", opset: int | None = None) -> OpEntry | None:
        """The entry for ``op_type`` at ``opset`` (None: the latest), or None."""
        for held in self._entries.get((standard_domain(domain), op_type), ()):
            if held.covers(opset):
                return held
        return None

    def lookup(self, op_type: str, *, domain: str | None = "", opset: int | None = None):
        """What is registered for ``op_type`` at ``opset`` (None: the latest), or None."""
        found = self.entry(op_type, domain=domain, opset=opset)
        return None if found is None else found.obj

    def __getitem__(self, op_type: str):
        found = self.lookup(op_type)
        if found is None:
            raise KeyError(op_type)
        return found

    def get(self, op_type: str, default=None):
        found = self.lookup(op_type)
        return default if found is None else found

    def entries(self) -> list[OpEntry]:
        """Every entry, in registration order."""
        return list(self._order)

    def op_types(self) -> list[str]:
        """Every op type held, as ``domain::Op`` outside the standard domain, sorted."""
        return sorted({entry.label for entry in self.entries()})

    def __len__(self) -> int:
        return len(self._order)


def _name_of(obj) -> str:
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    return f"{module}.{name}" if module and name else repr(obj)


class LoweringSet:
    """A plugin's lowerings for ``backend``, declared with :meth:`lowers` and registered with
    :meth:`register_all`. Two declarations for overlapping opsets of one op are an error at
    import, naming both functions."""

    def __init__(self, backend: str):
        self.backend = backend
        self.table = OpTable(f"a {backend} lowering", hint="give each function its own opset range (since/until)")

    def lowers(self, *op_types: str, domain: str = "", since: int = 1, until: int | None = None):
        """Declare the decorated function as the lowering of ``op_types`` for opsets ``[since, until]``."""

        def decorate(fn: Callable) -> Callable:
            for op_type in op_types:
                self.table.add(op_type, fn, domain=domain, since=since, until=until)
            return fn

        return decorate

    def register_all(self, register) -> None:
        for entry in self.table.entries():
            register(self.backend, entry.op_type, entry.obj, domain=entry.domain, since=entry.since, until=entry.until)
