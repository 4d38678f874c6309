"""Reference executor for Core ML ML Programs (MIL), so artifacts can be checked on Linux.

``run_mlpackage(path, inputs)`` reads a saved package back with coremltools' milproto loader
and evaluates it op by op in numpy. Op evaluators live in the ``ops_*`` modules and register
with :func:`registry.evaluates`; every ``ops_*`` module is imported on first use.
"""

from __future__ import annotations

__all__ = ["load_mlpackage", "run_mlpackage", "run_program"]


def __getattr__(name: str):
    # Lazy: importing coremltools costs seconds, and most commands never interpret a model.
    if name in __all__:
        from . import executor

        return getattr(executor, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
