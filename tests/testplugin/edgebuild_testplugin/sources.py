"""The source models of the shipped recipes, for tests that derive graphs from them.

Fetched through edgebuild's own resolver (the recipe's pinned version and sha256), once per test
process into one folder, so the test files that quantise or optimise the same model do not each
download it again.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache
from pathlib import Path

import yaml

RECIPES = Path(__file__).resolve().parents[3] / "recipes"


@cache
def _folder() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="edgebuild-test-sources-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


@cache
def shipped_source(recipe: str) -> Path:
    """The resolved source model of ``recipes/<recipe>.yaml``."""
    from edgebuild.graph.resolvers import resolve_pypi

    source = yaml.safe_load((RECIPES / f"{recipe}.yaml").read_text())["source"]
    return resolve_pypi(source["model"], sha256=source["sha256"], workdir=_folder(), base_dir=RECIPES)
