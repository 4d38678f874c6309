"""edgebuild: compile trained models into artifacts that run on Apple Silicon.

``edgebuild.build(...)`` and ``edgebuild.load_recipe(...)`` are the Python API
(:mod:`edgebuild.api`); it loads on first use, so ``import edgebuild`` stays cheap.
"""

import sys
import types

from edgebuild import deferred_sympy as _deferred_sympy
from edgebuild._version import __version__

# onnx_ir's core imports sympy (a second of a fresh process) for symbolic dims a pinned graph never makes
_deferred_sympy.defer_in("onnx_ir")

_API = ("load_recipe", "BuildResult", "VariantResult", "StageStatus", "Validation", "LoadedRecipe")
__all__ = ["__version__", "build", *_API]


def build(recipe, variant=None, **options):
    """Build a recipe like ``edgebuild run`` and return typed results: see :func:`edgebuild.api.build`."""
    from edgebuild.api import build as api_build

    return api_build(recipe, variant, **options)


def __getattr__(name: str):
    if name in _API:
        from edgebuild import api

        return getattr(api, name)
    raise AttributeError(f"module 'edgebuild' has no attribute {name!r}")


class _Package(types.ModuleType):
    """``edgebuild.build`` names both the API function and the package ``edgebuild/build/``.
    Importing the package binds it on ``edgebuild``; the attribute stays the function (the package
    is still ``sys.modules["edgebuild.build"]`` and ``from edgebuild.build.jobs import ...`` works)."""

    def __setattr__(self, name, value):
        if name == "build" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
