"""``edgebuild run`` and ``edgebuild plan``: drive the executor and tell the user what happened."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from edgebuild.build import (
    Build, load_variants, local_inputs, lock_data, materialise, open_store, plan_jobs, read_lock, settle_artifact, write_depfile,
)
from edgebuild.dag.executor import Executor
from edgebuild.errors import ValidationFailed


def _stage_line(label: str, stage: str, status: str, seconds: float) -> str:
    colour = "green" if status == "ran" else "cyan"
    return f"[dim]{label}[/] {stage:<9} [{colour}]{status:<6}[/] {seconds:7.2f}s"


def _done_line(build: Build) -> str:
    made = build.output_dir / build.artifact if build.artifact else build.output_dir
    return f"[bold]{build.job.label}[/] -> {_relative(made)}  (report: {_relative(build.output_dir / 'report.html')})"


def _event_printer(console, verbose: bool):
    def on_event(label: str, event: str, result) -> None:
        stage, _, what = event.partition(":")
        if what == "start":
            if verbose:
                console.print(f"[dim]{label}[/] {stage} …")
            return
        console.print(_stage_line(label, stage, result.status, result.seconds))
        for line in _warning_lines(result):
            console.print(line)

    return on_event


def _warning_lines(result) -> list[str]:
    """A stage's ``info["warnings"]`` (e.g. a compute plan with nothing on the Neural Engine)."""
    return [f"[yellow]warning[/] {text}" for text in (result.info or {}).get("warnings", [])]


def _variant_json(build: Build, *, as_cached: bool = False) -> dict:
    """The variant's ``run --json`` object; ``as_cached``: as a repeat of the run would report it."""
    job = build.job
    validation = job.results.get("validate")
    return {
        "recipe": build.variant.recipe.name,
        "variant": build.variant.name,
        "status": "failed" if job.error is not None else "built",
        "artifacts": [str(build.output_dir / build.artifact)] if build.artifact and job.error is None else [],
        "output_dir": str(build.output_dir),
        "stages": [{"name": r.name, "key": r.key, "status": "cached" if as_cached else r.status,
                    "seconds": 0.0 if as_cached else r.seconds}
                   for r in job.results.values()],
        "validation": validation.info if validation is not None else {},
        **({"error": str(job.error)} if job.error is not None else {}),
    }


def _report_data(build: Build) -> dict:
    results = build.job.results
    data = {
        "recipe": build.variant.recipe.name, "variant": build.variant.name,
        "artifact": {"path": build.artifact, "kind": Path(build.artifact).suffix.lstrip(".") or "bundle",
                     "size_bytes": _size(build, results)},
        "status": "built",
        "stages": [{"name": r.name, "status": r.status, "seconds": r.seconds, "key": r.key} for r in results.values()],
    }
    for name, result in results.items():
        if name != "resolve":
            data[name] = result.info
    # the sections the report page draws, lifted from the stages that measure them
    if "validate" in results:
        data["validation"] = results["validate"].info
    for name in ("lower", "compress", "package"):
        info = results[name].info if name in results else {}
        for key in ("plan", "sizes", "notes", "fp16_guard"):
            if key in info:
                data[key] = info[key]
    return data


def _size(build: Build, results) -> int:
    final = next((r for r in reversed(list(results.values())) if (r.path / build.artifact).exists()), None) \
        if build.artifact else None
    if final is None:
        return 0
    path = final.path / build.artifact
    return path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run_recipes(recipes, *, variants=None, jobs=1, cache_dir=None, no_cache=False, force=False,
                as_json=False, depfile=None, verbose=False, console) -> int:
    from edgebuild.registry import get_registry

    registry = get_registry()
    store = open_store(cache_dir)
    builds = plan_jobs(load_variants(recipes, variants, registry), registry, store)
    executor = Executor(None if no_cache else store, jobs=jobs, force=force, on_event=_event_printer(console, verbose))
    executor.run([b.job for b in builds])
    code = 0
    for build in builds:
        if build.job.error is not None:
            console.print(f"[red]error[/] {build.job.label}: {build.job.error}")
            code = max(code, build.job.error.exit_code)
            continue
        settle_artifact(build)
        build.written = materialise(build, registry, _report_data(build))
        failures = (build.job.results.get("validate").info.get("failures", [])
                    if build.job.results.get("validate") else [])
        if failures:
            for failure in failures:
                console.print(f"[red]threshold[/] {build.job.label}: {failure}")
            code = max(code, ValidationFailed.exit_code) if code != 1 else code
        console.print(_done_line(build))
    _write_comparisons(builds)
    dependencies = write_depfile(Path(depfile), builds) if depfile else None
    if as_json:
        sys.stdout.write(json.dumps({"variants": [_variant_json(b) for b in builds]}) + "\n")
    if code == 0 and not no_cache:
        _stamp(builds, as_json, (Path(depfile), dependencies) if depfile else None)
    return code


def _stamp(builds: list[Build], as_json: bool, depfile) -> None:
    """Let an identical repeat of this successful run answer without building (edgebuild.uptodate)."""
    from edgebuild import uptodate

    files, touch, lines = [], [], []
    for build in builds:
        files += local_inputs(build)
        for result in build.job.results.values():
            lines.append(_stage_line(build.job.label, result.name, "cached", 0.0))
            lines += _warning_lines(result)
            if result.name == "resolve":
                files.append(result.path)
                continue
            files += [result.path, *result.path.rglob("*")]  # the store entry's files
            touch.append(result.path.parent / "meta.json")
        files += [build.output_dir, *build.output_dir.rglob("*")]
    lines += [_done_line(build) for build in builds]
    stdout = json.dumps({"variants": [_variant_json(b, as_cached=True) for b in builds]}) + "\n" if as_json else ""
    uptodate.record(files=files, touch=touch, stderr=lines, stdout=stdout, depfile=depfile)


def _write_comparisons(builds: list[Build]) -> None:
    """One page per recipe with several variants, comparing their size and error."""
    roots = {}
    for build in builds:
        if build.job.error is None and build.written:
            roots.setdefault(build.output_dir.parent, []).append(build)
    for root, members in roots.items():
        if len(members) > 1 or len(list(root.glob("*/report.json"))) > 1:
            from edgebuild.verify.report import write_combined

            write_combined(root)


def _relative(path: Path) -> str:
    import os

    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def stage_plan(build: Build, store) -> list[dict]:
    """For each stage: cached, or would run and why (compared with the last build's lock file)."""
    previous = (read_lock(build.output_dir) or {}).get("stages", {})
    rows, known = [], {}
    executor = Executor(store)
    for stage in build.job.stages:
        row = {"name": stage.name, "key": None, "status": "would run", "reason": ""}
        before = previous.get(stage.name)
        if stage.resolve is not None:
            result = stage.resolve()
            known[stage.name] = result
            row.update(key=result.key, status="cached" if result.status == "cached" else "would run")
            if before and before.get("digest") != result.digest:
                row["reason"] = "source file changed"
            rows.append(row)
            continue
        if all(d in known for d in stage.deps):
            key = executor.key_of(stage, known)
            row["key"] = key
            entry = store.lookup(key)
            if entry is not None:
                from edgebuild.dag.stages import Result

                known[stage.name] = Result(stage.name, key, entry.digest, entry.out, entry.info, "cached", 0)
                row["status"] = "cached"
                rows.append(row)
                continue
        row["reason"] = _why(stage, before, known)
        rows.append(row)
    return rows


def _why(stage, before, known) -> str:
    if before is None:
        return "never built"
    changed = sorted(k for k in set(stage.params) | set(before.get("params", {}))
                     if stage.params.get(k) != before.get("params", {}).get(k))
    if changed:
        return "parameters changed: " + ", ".join(changed)
    inputs = [d for d in stage.deps if d not in known or known[d].digest != before.get("inputs", {}).get(d)]
    if inputs:
        return "input changed: " + ", ".join(inputs)
    if stage.plugins != before.get("plugins"):
        return "plugin version changed"
    return "not in the store (evicted or built elsewhere)"


def plan_recipe(recipe, *, chip=None, variants=None, cache_dir=None, as_json=False, console=None) -> None:
    from edgebuild.registry import get_registry

    registry = get_registry()
    store = open_store(cache_dir)
    builds = plan_jobs(load_variants([recipe], variants, registry), registry, store)
    out = {"variants": []}
    for build in builds:
        rows = stage_plan(build, store)
        entry = {"recipe": build.variant.recipe.name, "variant": build.variant.name, "stages": rows}
        backend = registry.get("backends", build.variant.recipe.target.backend)
        compute = getattr(backend, "compute_plan", None)
        if compute is not None:
            entry["compute"] = compute(build, store, registry, chip=chip, console=None if as_json else console)
        out["variants"].append(entry)
        if not as_json:
            from rich.table import Table

            table = Table("stage", "status", "why", title=f"{build.job.label}")
            for row in rows:
                table.add_row(row["name"], row["status"], row["reason"])
            console.print(table)
    if as_json:
        if len(out["variants"]) == 1 and "compute" in out["variants"][0]:
            out.update(out["variants"][0]["compute"])  # the documented top-level {"ops", "breakdown", "total_ms"}
        sys.stdout.write(json.dumps(out) + "\n")
