"""``edgebuild validate RECIPE...``: check every recipe given, report each, build nothing.

A CI job validating ``recipes/*.yaml`` learns about every broken recipe in one run, not the
first one only: each recipe gets a line (``ok`` or its error at file:line), and the exit code
is 2 when any failed (1 when the only failures are a plugin's, not the recipes').
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from edgebuild.errors import EdgebuildError


def check_recipe(recipe: Path, registry) -> list[str]:
    """The names of ``recipe``'s variants, once every check ``run`` makes at load has passed."""
    from edgebuild.build.jobs import load_variants
    from edgebuild.cli.arguments import check_recipe_paths
    from edgebuild.dag.stages import pipeline

    check_recipe_paths([recipe])
    variants = load_variants([str(recipe)], None, registry)
    for variant in variants:
        pipeline(variant, registry, lambda: None)  # checks backend, frontend and pass names
    return [v.name for v in variants]


def validate_recipes(recipes: list[Path], registry, *, as_json: bool, console) -> int:
    from rich.markup import escape

    from edgebuild.cli.json_errors import error_fields

    results, failures = [], []
    for recipe in recipes:
        try:
            names = check_recipe(recipe, registry)
        except EdgebuildError as exc:
            if exc.file is None:  # for an error that does not start with its file:line
                exc.file = str(recipe)
            failures.append(exc)
            results.append({"recipe": str(recipe), "status": "error", "variants": [], "error": error_fields(exc)})
            console.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
            continue
        results.append({"recipe": str(recipe), "status": "ok", "variants": names, "error": None})
        console.print(f"[green]ok[/] {escape(str(recipe))}: {len(names)} variant(s): {escape(', '.join(names))}",
                      soft_wrap=True)
    if len(recipes) > 1:
        console.print(f"{len(recipes) - len(failures)} of {len(recipes)} recipes valid")
    code = 2 if any(f.exit_code == 2 for f in failures) else max((f.exit_code for f in failures), default=0)
    if as_json:
        sys.stdout.write(json.dumps(_summary(results, failures)) + "\n")
    return code


def _summary(results: list[dict], failures: list[EdgebuildError]) -> dict:
    """One object: each recipe's result, and (when any failed) the ``error`` every failed
    ``--json`` command has: the first failure's."""
    from edgebuild.versions import edgebuild_version

    out: dict = {"recipes": results}
    if failures:
        out["error"] = next(r["error"] for r in results if r["error"] is not None)
    out["version"] = edgebuild_version()
    return out
