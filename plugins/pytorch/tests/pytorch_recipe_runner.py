"""Runs an example recipe end to end through the public entry point, as `edgebuild run --json` would."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

from rich.console import Console

RECIPES = Path(__file__).resolve().parents[3] / "recipes"


def copy_recipe(name: str, into: Path) -> Path:
    """The example recipe in ``into/recipes`` so its ``../build`` output lands under ``into``."""
    target = into / "recipes" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(RECIPES / name, target)
    return target


def run_recipe(recipe: Path, cache_dir: Path, variants: list[str] | None = None) -> tuple[int, dict]:
    from edgebuild.build.run import run_recipes

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = run_recipes([str(recipe)], variants=variants, cache_dir=str(cache_dir), as_json=True,
                           console=Console(file=io.StringIO()))
    return code, json.loads(stdout.getvalue())
