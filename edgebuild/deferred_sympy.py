"""sympy for the libraries that import it for symbolic shapes, imported once something symbolic is asked for.

coremltools' MIL types and onnx_ir's core import sympy at import time (0.15-1.2 s of a fresh
process, more than the rest of either) for symbolic shapes, yet a graph or program of fixed
shapes, such as most builds lower and most packages read back for validation, never makes a
symbol. What those modules do with sympy before one exists is to ask whether a value is symbolic
(``isinstance(v, sympy.Expr)``), to subclass ``sympy.Symbol`` for their own symbols, and to keep
a few of its functions in tables. While sympy is not imported, no value can be one of its
objects, so the answer is "no" without importing it.

:func:`defer_in` names a package (``onnx_ir`` by the core, ``coremltools`` by the Core ML plugin);
while one of its modules executes, ``import sympy`` gives it :data:`SYMPY`, which is taken out of
``sys.modules`` once they are done, so any other importer gets sympy itself. To such a package's
own code :data:`SYMPY` answers:

- ``Basic``, ``Expr``, ``Symbol`` and ``Atom`` are stand-in classes whose ``isinstance`` and
  ``issubclass`` checks ask sympy's classes once sympy is imported (by anyone) and are false
  before; a class deriving from the stand-in ``Symbol`` (coremltools' ``Symbol``) becomes a real
  subclass of ``sympy.Symbol`` on its first instance;
- the functions in ``STAND_IN_FUNCTIONS`` (what onnx_ir's expression parser keeps in a table) are
  callables that import sympy on their first call;
- any other name, or any name asked for by code outside those packages, imports sympy and is
  sympy's own.

``EDGEBUILD_EAGER_SYMPY=1`` turns it off (to debug something a library does differently).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.util
import os
import sys
import threading
import types

#: the classes those modules test values against (or derive from) before a symbol exists
STAND_IN_CLASSES = ("Basic", "Expr", "Symbol", "Atom")
#: the functions they keep in tables at import time (onnx_ir's expression parser), called later if ever
STAND_IN_FUNCTIONS = ("Max", "Min", "floor", "ceiling", "sqrt", "Mod", "Abs")
EAGER_ENV = "EDGEBUILD_EAGER_SYMPY"

_packages: set[str] = set()  # top-level packages whose code gets the stand-ins (``defer_in``)
_wrapped: set[str] = set()  # those of them whose loaders the finder here wraps
_executing = threading.local()  # per thread: how many of their modules are executing now

_lock = threading.RLock()
_wanted = False  # sympy itself was asked for: hand out no stand-in module from then on


def wanted() -> bool:
    return _wanted


def imported() -> types.ModuleType | None:
    """sympy itself, if it is imported completely (by anyone); None otherwise."""
    module = sys.modules.get("sympy")
    if module is None or module is SYMPY:
        return None
    spec = getattr(module, "__spec__", None)
    return None if spec is not None and getattr(spec, "_initializing", False) else module


def load() -> types.ModuleType:
    """Import sympy itself (once) and make every class derived from a stand-in real."""
    global _wanted
    with _lock:
        _wanted = True
        if sys.modules.get("sympy") is SYMPY:
            del sys.modules["sympy"]
        module = importlib.import_module("sympy")
        for stand_in in list(_StandIn.derived):
            stand_in.real()
        return module


class _StandIn(type):
    """The metaclass of the stand-in classes and of the classes derived from them.

    ``isinstance(x, C)`` and ``issubclass(T, C)`` are false while sympy is not imported (no sympy
    object can exist yet), and then those of the real class; calling a derived class imports sympy
    and creates an instance of its real counterpart."""

    derived: list = []  # classes a deferring package derived from a stand-in, made real on first use

    def __new__(mcs, name, bases, namespace, *, sympy_name: str | None = None):
        if "__classcell__" in namespace:  # zero-argument super() binds the class: build the real one now
            load()
            return type(name, tuple(b.real() if isinstance(b, _StandIn) else b for b in bases), namespace)
        cls = super().__new__(mcs, name, bases, dict(namespace))
        cls._sympy_name = sympy_name  # set on a stand-in for sympy's class of that name
        cls._namespace = None if sympy_name else dict(namespace)
        cls._real = None
        if sympy_name is None:
            _StandIn.derived.append(cls)
        return cls

    def __init__(cls, name, bases, namespace, **kwargs):
        super().__init__(name, bases, namespace)

    def real(cls) -> type:
        """The real class: sympy's, or the one derived from sympy's classes with this body."""
        if cls._real is None:
            with _lock:
                sympy = imported() or load()  # load() makes every derived class real, this one too
                if cls._real is None:
                    if cls._sympy_name is not None:
                        cls._real = getattr(sympy, cls._sympy_name)
                    else:
                        bases = tuple(b.real() if isinstance(b, _StandIn) else b for b in cls.__bases__)
                        cls._real = type(cls.__name__, bases, cls._namespace)
                        _rebind(cls, cls._real)
        return cls._real

    def _known_real(cls) -> type | None:
        """The real class if it may have instances (sympy is imported), else None."""
        if cls._real is not None:
            return cls._real
        return cls.real() if imported() is not None else None

    def __instancecheck__(cls, obj) -> bool:
        real = cls._known_real()
        return real is not None and isinstance(obj, real)

    def __subclasscheck__(cls, sub) -> bool:
        real = cls._known_real()
        return real is not None and issubclass(sub, real)

    def __call__(cls, *args, **kwargs):
        return cls.real()(*args, **kwargs)


def _rebind(stand_in: type, real: type) -> None:
    """Where the deferring packages' modules name the derived class, name the real one (their code
    then makes its instances directly, and pickling finds the class by its name)."""
    for name, module in list(sys.modules.items()):
        if name.partition(".")[0] in _packages and module is not None:
            namespace = getattr(module, "__dict__", {})
            for attribute, value in list(namespace.items()):
                if value is stand_in:
                    namespace[attribute] = real


_STAND_INS = {name: _StandIn(name, (), {"__module__": __name__}, sympy_name=name) for name in STAND_IN_CLASSES}


def _stand_in_function(name: str):
    def call(*args, **kwargs):
        return getattr(imported() or load(), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


_STAND_IN_FUNCTIONS = {name: _stand_in_function(name) for name in STAND_IN_FUNCTIONS}


class _DeferredSympy(types.ModuleType):
    """``sympy`` as the deferring packages' modules see it until something needs sympy itself."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            if sys._getframe(1).f_code.co_name == "_init_module_attrs":  # importlib setting this module up
                raise AttributeError(name)
            return getattr(imported() or load(), name)  # anyone else's question: sympy's own answer
        real = imported()
        if real is None and (name in _STAND_INS or name in _STAND_IN_FUNCTIONS) and _asked_by_a_deferring_package():
            return _STAND_INS.get(name) or _STAND_IN_FUNCTIONS[name]
        return getattr(real or load(), name)


def _asked_by_a_deferring_package() -> bool:
    frame = sys._getframe(2)  # the caller of __getattr__
    return str(frame.f_globals.get("__name__", "")).partition(".")[0] in _packages


SYMPY = _DeferredSympy("sympy", "sympy, imported once something symbolic is asked for (edgebuild.deferred_sympy)")


def eager_requested() -> bool:
    return os.environ.get(EAGER_ENV, "").strip().lower() not in ("", "0", "false", "no")


def defer_in(package: str, *, wrap_loaders: bool = True) -> None:
    """Give ``package``'s modules :data:`SYMPY` for ``import sympy`` from now on; a no-op where the
    package or sympy is imported already, or ``EDGEBUILD_EAGER_SYMPY`` is set. ``wrap_loaders=False``:
    the caller's own import hook wraps the package's loaders and runs them inside :func:`deferring`."""
    if package in sys.modules or "sympy" in sys.modules or eager_requested():
        return
    _packages.add(package)
    if wrap_loaders:
        _wrapped.add(package)
    if not any(isinstance(finder, _DeferringFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _DeferringFinder())


@contextlib.contextmanager
def deferring():
    """The block executes a deferring package's module: ``import sympy`` in it gets :data:`SYMPY`,
    which leaves ``sys.modules`` when the outermost such block in the thread ends (the modules keep
    it; anyone else imports sympy itself)."""
    _executing.depth = getattr(_executing, "depth", 0) + 1
    try:
        yield
    finally:
        _executing.depth -= 1
        if _executing.depth == 0 and sys.modules.get("sympy") is SYMPY:
            del sys.modules["sympy"]


class _DeferringFinder(importlib.abc.MetaPathFinder):
    """Hands out :data:`SYMPY` inside :func:`deferring` blocks; wraps the loaders of the packages
    ``defer_in`` wraps so that their modules execute inside one."""

    def find_spec(self, fullname, path, target=None):
        if fullname == "sympy" and getattr(_executing, "depth", 0) > 0 and not _wanted:
            return importlib.util.spec_from_loader("sympy", _DeferredSympyLoader())
        if fullname.partition(".")[0] not in _wrapped:
            return None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    if spec.loader is not None and not isinstance(spec.loader, _DeferringLoader):
                        spec.loader = _DeferringLoader(spec.loader)
                    return spec
        return None


class _DeferringLoader(importlib.abc.Loader):
    """A deferring package's own loader, executing its modules inside :func:`deferring`."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        with deferring():
            self._loader.exec_module(module)

    def __getattr__(self, name):  # resources, source, file names: the wrapped loader's
        return getattr(self._loader, name)


class _DeferredSympyLoader(importlib.abc.Loader):
    """Gives the deferring packages' modules the one deferred sympy module."""

    def create_module(self, spec):
        return SYMPY

    def exec_module(self, module):
        pass
