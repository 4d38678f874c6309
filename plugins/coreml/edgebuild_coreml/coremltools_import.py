"""coremltools imported without the other frameworks' frontends, in processes that have no use for them.

``import coremltools`` imports, through ``coremltools._deps``, every framework it ships a frontend
or converter for: torch (and with it ``coremltools.optimize.torch``), torchvision, sklearn,
tensorflow, xgboost, libsvm, transformers, and scipy (for sparse inputs to its sklearn
converters and evaluation helpers). That is about three quarters of its import time, and lowering
an ONNX graph uses none of it. coremltools decides once, at import, which frontends it
has (``coremltools._deps._HAS_TORCH`` and the like), so :func:`install` puts a finder first on
``sys.meta_path`` that wraps the loader of every ``coremltools`` module: while one executes, the
frameworks in ``HIDDEN`` cannot be imported, and afterwards they import as usual (``import torch``
works later in the same process). The deliberate ``sys.modules``-level trick is kept here alone.

- Only when torch is not imported yet: a process that has torch gets coremltools whole.
- Only in the thread executing coremltools' modules, and only names not imported yet.
- transformers is hidden too: imported while torch is hidden, it would record "no torch" for the
  whole process.
- ``EDGEBUILD_COREMLTOOLS_FULL_IMPORT=1`` turns it off (to debug something coremltools does
  differently with a framework present).

- ``DEFERRED`` modules (coremltools' experimental remote-device and profiling helpers, which bring
  asyncio and ssl with them) are imported on first use instead of with ``coremltools.models``:
  nothing in a conversion uses them, and about 50 ms of every process's import goes.
- sympy, which coremltools' MIL types import for symbolic shapes (half of what is left of the
  import), is imported once something symbolic is asked for: while coremltools' modules execute,
  ``import sympy`` gives them ``edgebuild.plugin.deferred_sympy.SYMPY`` (that module says how
  it answers for sympy until then); every other importer gets sympy itself.

A coremltools imported this way keeps no torch frontend for the rest of the process, even once
torch is imported; the PyTorch plugin's ``route: coreml`` converts in a fresh process then.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import threading

from edgebuild.plugin import deferred_sympy

HIDDEN = frozenset({"torch", "torchvision", "torchaudio", "torchao", "executorch", "sklearn", "tensorflow",
                    "xgboost", "libsvm", "transformers", "scipy"})
FULL_IMPORT_ENV = "EDGEBUILD_COREMLTOOLS_FULL_IMPORT"
# executed on first attribute access (importlib.util.LazyLoader); no other coremltools module reads them
DEFERRED = frozenset({"coremltools.models.ml_program.experimental"})

_executing = threading.local()  # per thread: how many coremltools modules are executing with frameworks hidden


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once); a no-op when coremltools is imported already."""
    if "coremltools" in sys.modules or any(isinstance(f, _LeanCoremltoolsFinder) for f in sys.meta_path):
        return
    if not full_import_requested():
        deferred_sympy.defer_in("coremltools", wrap_loaders=False)
    sys.meta_path.insert(0, _LeanCoremltoolsFinder())


def full_import_requested() -> bool:
    return os.environ.get(FULL_IMPORT_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _hiding() -> bool:
    # torch imported meanwhile by another thread: coremltools finds it, so it may have the rest too
    return getattr(_executing, "depth", 0) > 0 and "torch" not in sys.modules


class _LeanCoremltoolsFinder(importlib.abc.MetaPathFinder):
    """Wraps coremltools' loaders; refuses the hidden frameworks while one of them executes."""

    def find_spec(self, fullname, path, target=None):
        top = fullname.partition(".")[0]
        if top in HIDDEN and _hiding() and top not in sys.modules:
            raise ModuleNotFoundError(
                f"{fullname} is not imported while coremltools is "
                f"(set {FULL_IMPORT_ENV}=1 for coremltools with every frontend)", name=fullname)
        if top != "coremltools":
            return None
        spec = self._spec_from_other_finders(fullname, path, target)
        if spec is not None and spec.loader is not None and not isinstance(spec.loader, _LeanLoader):
            spec.loader = _LeanLoader(spec.loader)
            if fullname in DEFERRED:
                spec.loader = importlib.util.LazyLoader(spec.loader)
        return spec

    def _spec_from_other_finders(self, fullname, path, target):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return None


class _LeanLoader(importlib.abc.Loader):
    """coremltools' own loader, executing the module with the frameworks hidden when torch is not imported."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        if "torch" in sys.modules or full_import_requested():
            self._loader.exec_module(module)
            return
        _executing.depth = getattr(_executing, "depth", 0) + 1
        try:
            with deferred_sympy.deferring():
                self._loader.exec_module(module)
        finally:
            _executing.depth -= 1

    def __getattr__(self, name):  # resources, source, file names: the wrapped loader's
        return getattr(self._loader, name)
