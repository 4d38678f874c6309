"""Runs a recipe end to end with the PyTorch frontend as the validation reference.

The core's validate stage takes its reference from onnxruntime on the source file, which a
PyTorch source is not. Until it asks the frontend (``frontend.reference`` and
``frontend.input_specs``), these tests route those two look-ups to the frontend.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import yaml
from rich.console import Console

RECIPES = Path(__file__).resolve().parents[3] / "recipes"


def copy_recipe(name: str, into: Path) -> Path:
    """The example recipe in ``into/recipes`` so its ``../build`` output lands under ``into``."""
    target = into / "recipes" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(RECIPES / name, target)
    return target


def run_with_torch_reference(recipe: Path, monkeypatch, cache_dir: Path) -> tuple[int, dict]:
    import edgebuild.dag.validate as validate_module
    from edgebuild.run import run_recipes

    from edgebuild_pytorch.frontend import PyTorchFrontend

    source = yaml.safe_load(recipe.read_text())["source"]
    frontend = PyTorchFrontend()
    monkeypatch.setattr(validate_module, "onnx_input_specs", lambda path, inputs: frontend.input_specs(source))
    monkeypatch.setattr(validate_module, "onnxruntime_runner",
                        lambda path: frontend.reference(path, source, recipe.parent))
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = run_recipes([str(recipe)], cache_dir=str(cache_dir), as_json=True, console=Console(file=io.StringIO()))
    return code, json.loads(stdout.getvalue())
