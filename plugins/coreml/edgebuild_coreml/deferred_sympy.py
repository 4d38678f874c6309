"""sympy for coremltools' MIL modules, imported only once something symbolic is asked for.

coremltools' MIL types import sympy (0.15-0.25 s, half of a lean ``import coremltools``) for
symbolic shapes, yet a program of fixed shapes, such as most packages read back for validation,
never makes a symbol. What those modules do with sympy before one exists is to ask whether a
value is symbolic (``issubclass(type(v), sympy.Basic)``), and to subclass ``sympy.Symbol`` for
their own symbols. While sympy is not imported, no value can be one of its objects, so the
answer is "no" without importing it.

:data:`SYMPY` is the module coremltools' modules get for ``import sympy`` while they are
imported lean (:mod:`edgebuild_coreml.coremltools_import` hands it out and takes it out of
``sys.modules`` once they are done, so any other importer gets sympy itself):

- to coremltools' own code, ``Basic``, ``Expr``, ``Symbol`` and ``Atom`` are stand-in classes
  whose ``isinstance``/``issubclass`` checks ask sympy's classes once sympy is imported (by
  anyone) and are false before; a class deriving from the stand-in ``Symbol`` (coremltools'
  ``Symbol``) becomes a real subclass of ``sympy.Symbol`` on its first instance;
- any other name, or any name asked for by code outside coremltools, imports sympy and is
  sympy's own.
"""

from __future__ import annotations

import importlib
import sys
import threading
import types

#: the classes coremltools' modules test values against (or derive from) before a symbol exists
STAND_IN_CLASSES = ("Basic", "Expr", "Symbol", "Atom")

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
    """Import sympy itself (once) and make every coremltools class derived from a stand-in real."""
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

    derived: list = []  # classes coremltools derived from a stand-in, made real on first use

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
    """Where coremltools' modules name the derived class, name the real one (their code then makes
    its instances directly, and pickling finds the class by its name)."""
    for name, module in list(sys.modules.items()):
        if name.partition(".")[0] == "coremltools" and module is not None:
            namespace = getattr(module, "__dict__", {})
            for attribute, value in list(namespace.items()):
                if value is stand_in:
                    namespace[attribute] = real


_STAND_INS = {name: _StandIn(name, (), {"__module__": __name__}, sympy_name=name) for name in STAND_IN_CLASSES}


class _DeferredSympy(types.ModuleType):
    """``sympy`` as coremltools' modules see it until something needs sympy itself."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            if sys._getframe(1).f_code.co_name == "_init_module_attrs":  # importlib setting this module up
                raise AttributeError(name)
            return getattr(imported() or load(), name)  # anyone else's question: sympy's own answer
        real = imported()
        if real is None and name in _STAND_INS and _asked_by_coremltools():
            return _STAND_INS[name]
        return getattr(real or load(), name)


def _asked_by_coremltools() -> bool:
    frame = sys._getframe(2)  # the caller of __getattr__
    return str(frame.f_globals.get("__name__", "")).partition(".")[0] == "coremltools"


SYMPY = _DeferredSympy("sympy", "sympy, imported once something symbolic is asked for (edgebuild_coreml)")
