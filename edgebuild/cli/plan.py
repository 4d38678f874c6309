"""``edgebuild plan``: print (or ``--json``) the stages and the backend's compute plan of each variant."""

from __future__ import annotations

import json
import sys

from edgebuild.build.jobs import Build, load_variants, plan_jobs
from edgebuild.build.plan import stage_output, stage_plan
from edgebuild.store.location import open_store


def plan_recipe(recipe, *, chip=None, variants=None, cache_dir=None, as_json=False, console=None, ops=False) -> None:
    from edgebuild.registry import get_registry

    registry = get_registry()
    store = open_store(cache_dir, create=False)  # read-only: a missing store is empty, and is not made
    builds = plan_jobs(load_variants([recipe], variants, registry), registry, store)
    out = {"variants": []}
    for build in builds:
        rows = stage_plan(build, store)
        entry = {"recipe": build.variant.recipe.name, "variant": build.variant.name, "stages": rows}
        backend = registry.get("backends", build.variant.recipe.target.backend)
        compute = backend.compute_plan(build.variant, registry, chip=chip,
                                       output_of=lambda name, build=build: stage_output(build, store, name))
        if compute is not None:
            entry["compute"] = compute
        out["variants"].append(entry)
        if not as_json:
            _print_plan(build, entry, console, ops=ops)
    if as_json:
        if len(out["variants"]) == 1 and "compute" in out["variants"][0]:
            out.update(out["variants"][0]["compute"])  # the documented top-level {"ops", "breakdown", "total_ms"}
        sys.stdout.write(json.dumps(out) + "\n")


def _print_plan(build: Build, entry: dict, console, *, ops: bool) -> None:
    """A variant's plan, summary first: the compute plan by unit and by op type and reason (every
    op with ``ops``), then which stages would run and why."""
    from rich.markup import escape as escape_markup
    from rich.table import Table

    from edgebuild.report.compute_plan import render

    console.rule(f"[bold]{escape_markup(build.job.label)}[/]")
    if "compute" in entry:
        render(entry["compute"], console, ops=ops)
    table = Table("stage", "status", "why", title="stages")
    for row in entry["stages"]:
        table.add_row(row["name"], row["status"], escape_markup(row["reason"]))
    console.print(table)
