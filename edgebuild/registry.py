"""The plugin registry: pluggy loads every ``edgebuild`` entry point and collects what each registers."""

from __future__ import annotations

import importlib.metadata as md
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import pluggy

from edgebuild import hookspecs
from edgebuild.versions import key_version
from edgebuild.errors import PluginError, UsageError
from edgebuild.registration import Lazy, OpTable
from edgebuild.protocols import PROTOCOLS, RecipeSection, missing_members

KINDS = (
    "resolvers",
    "frontends",
    "passes",
    "lowerings",
    "backends",
    "runtimes",
    "recipe_sections",
    "custom_ops",
    "commands",
    "conformance_suites",
)


@dataclass
class Entry:
    plugin: str
    obj: Any
    meta: dict = field(default_factory=dict)


@dataclass
class PluginInfo:
    name: str
    distribution: str
    version: str
    registered: dict[str, list[str]] = field(default_factory=dict)


class _LazyTables(dict):
    """Kind -> table, each filled on first access: a build that never lowers never imports
    the lowering modules (and coremltools behind them), which keeps no-op runs fast."""

    def __init__(self, registry: "Registry"):
        super().__init__()
        self._registry = registry
        self._lock = threading.RLock()  # re-entrant: a plugin's hook adds to the table being filled
        self._filling: dict[str, dict] = {}

    def __missing__(self, kind: str) -> dict:
        if kind not in KINDS:
            raise KeyError(kind)
        # Variants built in threads (-j N) may ask for a kind at once: a table is published only when
        # every plugin has registered into it, and the others wait for it instead of reading it half full.
        with self._lock:
            if dict.__contains__(self, kind):
                return dict.__getitem__(self, kind)
            if kind in self._filling:  # the loading thread's own registrations
                return self._filling[kind]
            table = self._filling[kind] = {}
            try:
                self._registry._load(kind)
            finally:
                del self._filling[kind]
            self[kind] = table
            return table


class Registry:
    """Tables of what plugins registered, keyed by kind then by name; lowerings by backend, each
    an :class:`~edgebuild.registration.OpTable` (look one up with :meth:`lowering`)."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[Any, Entry | OpTable]] = _LazyTables(self)
        self.plugins: dict[str, PluginInfo] = {}
        self._pm: pluggy.PluginManager | None = None
        self._dists: dict[str, tuple[str, str]] = {}

    # -- registration -------------------------------------------------------------------
    def _add(self, kind: str, key, plugin: str, obj, label: str, **meta) -> None:
        held = self.tables[kind].get(key)
        if held is not None:
            raise PluginError(
                f"plugin {plugin!r} registers {kind[:-1]} {label!r}, "
                f"which plugin {held.plugin!r} already holds",
                hint="uninstall one of the two, or give the new one another name",
            )
        self.tables[kind][key] = Entry(plugin, obj, meta)
        self.plugins[plugin].registered.setdefault(kind, []).append(label)
        self._expect_protocol(kind, label, plugin, obj)

    def _expect_protocol(self, kind: str, label: str, plugin: str, obj) -> None:
        """Check ``obj`` against its kind's protocol: now, or when a ``Lazy`` first loads it."""
        if kind == "recipe_sections":
            if not (isinstance(obj, type) and issubclass(obj, RecipeSection)):
                raise PluginError(f"plugin {plugin!r} registers recipe section {label!r} with {obj!r}, which is not "
                                  "a subclass of edgebuild.protocols.RecipeSection",
                                  hint="derive the section's pydantic model from edgebuild.protocols.RecipeSection")
            return
        protocol = PROTOCOLS.get(kind)
        if protocol is None:
            return

        singular = {"passes": "pass", "custom_ops": "custom op"}.get(kind, kind[:-1])

        def check(real) -> None:
            missing = missing_members(real, protocol)
            if not missing:
                return
            names = ", ".join(missing)
            if protocol in type(real).__mro__:  # subclassed, but a member the protocol only declares is left undefined
                hint = (f"define {names} in {type(real).__qualname__}: edgebuild.plugin.{protocol.__name__} declares "
                        f"{'it' if len(missing) == 1 else 'them'} without a default")
            else:
                hint = f"subclass edgebuild.plugin.{protocol.__name__}: it declares each member, with defaults"
            raise PluginError(f"plugin {plugin!r} registers {singular} {label!r} without {names} "
                              f"(edgebuild.protocols.{protocol.__name__})", hint=hint)

        if isinstance(obj, Lazy):
            obj.when_loaded(check)
            obj.when_loaded(lambda real: _check_known(obj, real, plugin, singular, label))
        else:
            check(obj)

    def _callbacks(self, plugin: str) -> dict[str, Callable]:
        def named(kind):
            return lambda name, obj: self._add(kind, name, plugin, obj, name)

        def lowering(backend, op_type, fn, domain="", since=1, until=None):
            table = self.tables["lowerings"].get(backend)
            if table is None:
                table = self.tables["lowerings"][backend] = OpTable(
                    f"a {backend} lowering", hint="narrow the opset range (since/until) or drop one of the plugins")
            entry = table.add(op_type, fn, domain=domain, since=since, until=until, owner=f"plugin {plugin!r}")
            self.plugins[plugin].registered.setdefault("lowerings", []).append(f"{backend}:{entry.label}")

        def custom_op(domain, op_type, spec):
            self._add("custom_ops", (domain, op_type), plugin, spec, f"{domain}::{op_type}")

        return {
            "resolvers": named("resolvers"),
            "frontends": named("frontends"),
            "passes": named("passes"),
            "lowerings": lowering,
            "backends": named("backends"),
            "runtimes": named("runtimes"),
            "recipe_sections": named("recipe_sections"),
            "custom_ops": custom_op,
            "commands": named("commands"),
            "conformance_suites": named("conformance_suites"),
        }

    def collect(self, pm: pluggy.PluginManager, dists: dict[str, tuple[str, str]]) -> None:
        """Remember the plugins; their hooks run per kind, on first use of that kind."""
        self._pm, self._dists = pm, dists
        for name, _ in pm.list_name_plugin():
            dist, version = dists.get(name, ("", ""))
            self.plugins.setdefault(name, PluginInfo(name, dist, version))

    def load_all(self) -> "Registry":
        for kind in KINDS:
            self.tables[kind]
        return self

    def _load(self, kind: str) -> None:
        """Call each plugin's hook for ``kind`` with callbacks that remember the plugin's name."""
        if self._pm is None:
            return
        hook = getattr(self._pm.hook, f"edgebuild_register_{kind}")
        for impl in hook.get_hookimpls():  # registration order
            try:
                impl.function(register=self._callbacks(impl.plugin_name)[kind])
            except PluginError:
                raise
            except Exception as exc:
                dist, version = self._dists.get(impl.plugin_name, ("", ""))
                raise PluginError(
                    f"plugin {impl.plugin_name!r} ({dist or '?'} {version}) failed while registering "
                    f"{kind}: {type(exc).__name__}: {exc}",
                    hint=f"fix or uninstall it: pip uninstall {dist or impl.plugin_name}",
                ) from exc

    # -- lookup -------------------------------------------------------------------------
    def get(self, kind: str, name):
        entry = self.tables[kind].get(name)
        return entry.obj if entry else None

    def names(self, kind: str) -> list:
        return list(self.tables[kind])

    def lowering(self, backend: str, op_type: str, domain: str, opset: int):
        """The lowering for ``op_type`` at ``opset``, or None."""
        table = self.tables["lowerings"].get(backend)
        return None if table is None else table.lookup(op_type, domain=domain, opset=opset)

    def default_backend(self) -> str:
        """The backend used where none is named: the one whose object says ``default = True``, else
        the only one installed (see :attr:`edgebuild.protocols.Backend.default`)."""
        names = self.names("backends")
        claiming = [name for name in names if self.get("backends", name).default]
        if len(claiming) > 1:
            holders = ", ".join(f"{name!r} (plugin {self.plugin_of('backends', name).name!r})" for name in claiming)
            raise PluginError(f"backends {holders} each claim to be the default",
                              hint="uninstall all but one of those plugins, or name the backend to use")
        if claiming:
            return claiming[0]
        if len(names) == 1:
            return names[0]
        if not names:
            raise UsageError("no backend is installed", hint="install a backend plugin: see docs/start.md (Install)")
        raise UsageError(f"no installed backend is the default; there are {len(names)}: {', '.join(names)}",
                         hint="name the one to use")

    def versions(self) -> dict[str, str]:
        return {p.distribution or p.name: p.version for p in self.plugins.values()}

    def plugins_for(self, kinds) -> dict[str, str]:
        """Distribution -> key version of every plugin that registers things of ``kinds`` (implements
        their hooks): the code a stage that may call those kinds runs, named in its key (a plugin
        registering only other kinds, say a command, changes no key of it). Read from the hooks'
        implementers, not their registrations, so that planning a build runs no registration
        hook (the lowerings' imports coremltools) and a fully cached run stays light."""
        if self._pm is None:
            return {}
        implementing = {impl.plugin_name for kind in kinds
                        for impl in getattr(self._pm.hook, f"edgebuild_register_{kind}").get_hookimpls()}
        return {p.distribution or p.name: p.version for name, p in self.plugins.items() if name in implementing}

    def plugin_of(self, kind: str, name) -> PluginInfo | None:
        entry = self.tables[kind].get(name)
        return self.plugins.get(entry.plugin) if entry else None


def _load_entry_points(pm: pluggy.PluginManager) -> dict[str, tuple[str, str]]:
    dists = {}
    for ep in sorted(md.entry_points(group="edgebuild"), key=lambda e: e.name):
        dist = ep.dist.name if ep.dist else ""
        version = ep.dist.version if ep.dist else ""
        try:
            module = ep.load()
        except Exception as exc:  # a broken plugin must not look like a broken edgebuild
            raise PluginError(
                f"plugin {ep.name!r} (distribution {dist or '?'} {version}) failed to import: "
                f"{type(exc).__name__}: {exc}",
                hint=f"fix or uninstall it: pip uninstall {dist or ep.name}",
            ) from exc
        if pm.is_registered(module) or pm.get_plugin(ep.name) is not None:
            continue
        pm.register(module, name=ep.name)
        dists[ep.name] = (dist, key_version(version, ep.module.split(".")[0]))
    return dists


_REGISTRY: Registry | None = None


def build_registry(extra: dict[str, object] | None = None) -> Registry:
    """A registry of the installed entry points plus ``extra`` plugin objects (for tests)."""
    pm = pluggy.PluginManager("edgebuild")
    pm.add_hookspecs(hookspecs)
    dists = _load_entry_points(pm)
    for name, plugin in (extra or {}).items():
        pm.register(plugin, name=name)
        dists[name] = (name, "0")
    registry = Registry()
    registry.collect(pm, dists)
    return registry


def get_registry(refresh: bool = False) -> Registry:
    """The process-wide registry, built on first use from the installed entry points."""
    global _REGISTRY
    if _REGISTRY is None or refresh:
        _REGISTRY = build_registry()
    return _REGISTRY


def _check_known(stand_in: Lazy, real, plugin: str, singular: str, label: str) -> None:
    """What a plugin said of an object without importing it (``Lazy.known``) must be what it is:
    its values (a function said in its place stands in for a method, and is not compared)."""
    for name, said in stand_in.known_attributes().items():
        if not isinstance(said, (bool, int, float, str, tuple, frozenset, type(None))):
            continue
        actual = getattr(real, name, None)
        if actual != said:
            raise PluginError(f"plugin {plugin!r} registers {singular} {label!r} as having {name}={said!r}, "
                              f"but it has {name}={actual!r}",
                              hint=f"make the registration's .known({name}=...) match the object")
