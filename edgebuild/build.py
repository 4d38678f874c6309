"""``edgebuild run``: recipes -> variants -> stage chains -> store -> output directories."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from edgebuild.dag import hashstate
from edgebuild.dag.atomic import replace_path, write_text_atomic
from edgebuild.dag.executor import Executor, Job
from edgebuild.dag.stages import Result, Stage, artifact_of, pipeline, versions
from edgebuild.dag.store import Store
from edgebuild.errors import UsageError
from edgebuild.recipe import Variant, load_recipe

LOCK_NAME = "edgebuild.lock.json"


def cache_root(cache_dir: str | Path | None) -> Path:
    if cache_dir:
        return Path(cache_dir).expanduser().resolve()
    if os.environ.get("EDGEBUILD_CACHE_DIR"):
        return Path(os.environ["EDGEBUILD_CACHE_DIR"]).expanduser().resolve()
    import platformdirs

    return Path(platformdirs.user_cache_dir("edgebuild"))


def open_store(cache_dir=None) -> Store:
    root = cache_root(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    hashstate.configure(root / "state.db")
    return Store(root)


def validate_sections(variant: Variant, registry) -> None:
    """Let the plugins that own sections (compression, target.options, ...) validate them."""
    from edgebuild.recipe.sections import validate_plugin_sections

    validate_plugin_sections(variant, registry)


def load_variants(paths: list[str], only: list[str] | None, registry) -> list[Variant]:
    variants = []
    for path in paths:
        variants.extend(load_recipe(path, only=only or None, sections=lambda v: validate_sections(v, registry)))
    return variants


def source_resolver(variant: Variant, registry, store: Store):
    from edgebuild.graph.resolvers import scheme_of

    def resolve() -> Result:
        uri = variant.recipe.source.model
        scheme = scheme_of(uri)
        resolver = registry.get("resolvers", scheme)
        if resolver is None:
            raise UsageError(f"source.model: no installed resolver for {scheme!r} sources")
        start, wall = time.perf_counter(), time.time()
        path = Path(resolver(uri, sha256=variant.recipe.source.sha256, workdir=store.root / "sources",
                             base_dir=variant.base_dir))
        digest = hashstate.file_sha256(path)  # remembered by stat, so this is free when unchanged
        fetched = scheme != "file" and path.stat().st_mtime >= wall - 1
        return Result("resolve", digest, digest, path, {"uri": uri, "sha256": digest},
                      "ran" if fetched else "cached", round(time.perf_counter() - start, 3))

    return resolve


@dataclass
class Build:
    variant: Variant
    job: Job
    output_dir: Path
    artifact: str
    written: bool = False  # the output directory was (re)written by this run


def plan_jobs(variants: list[Variant], registry, store: Store) -> list[Build]:
    builds = []
    for variant in variants:
        stages = pipeline(variant, registry, source_resolver(variant, registry, store))
        job = Job(f"{variant.recipe.name}:{variant.name}", stages)
        builds.append(Build(variant, job, variant.output_dir(), artifact_of(stages)))
    return builds


def settle_artifact(build: Build) -> None:
    """The artifact stage may report what it actually made (``info["artifact"]``): a bundle
    whose model Core ML runs whole is a plain ``model.mlpackage``."""
    for stage in reversed(build.job.stages):
        if stage.extra.get("artifact") and stage.name in build.job.results:
            build.artifact = build.job.results[stage.name].info.get("artifact", build.artifact)
            return


def lock_data(build: Build, registry) -> dict:
    stages = {}
    for stage in build.job.stages:
        result = build.job.results.get(stage.name)
        if result is None:
            continue
        stages[stage.name] = {
            "key": result.key, "digest": result.digest, "params": stage.params,
            "inputs": {d: build.job.results[d].digest for d in stage.deps}, "plugins": stage.plugins,
        }
    return {
        "recipe": build.variant.recipe.name, "variant": build.variant.name,
        "versions": versions(registry), "stages": stages, "artifact": build.artifact,
    }


def read_lock(output_dir: Path) -> dict | None:
    try:
        return json.loads((output_dir / LOCK_NAME).read_text())
    except (OSError, ValueError):
        return None


def materialise(build: Build, registry, report_data: dict) -> bool:
    """Write the variant's output directory in one rename: artifact, reports, lock file.

    Returns False when the directory was already up to date and left alone."""
    out = build.output_dir
    lock = lock_data(build, registry)
    previous = read_lock(out)
    # (edgebuild.verify.report's names; not imported: it loads numpy, which a cached run need not)
    complete = all((out / name).exists() for name in (build.artifact, "report.json", "report.html"))
    if previous is not None and previous.get("stages") == lock["stages"] and complete:
        return False  # nothing changed: leave the directory (and its timestamps, for make) alone
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        final = build.job.stages[-1].name
        for stage in reversed(build.job.stages):
            if stage.extra.get("artifact"):
                final = stage.name
                break
        source = build.job.results[final].path / build.artifact if build.artifact else None
        if source is not None and source.exists():
            if source.is_dir():
                shutil.copytree(source, tmp / build.artifact, copy_function=_link_or_copy)
            else:
                _link_or_copy(source, tmp / build.artifact)
        from edgebuild.verify.report import write_report

        write_report(tmp, report_data)
        write_text_atomic(tmp / LOCK_NAME, json.dumps(lock, indent=2, sort_keys=True))
        replace_path(tmp, out)
        return True
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _link_or_copy(src, dst) -> None:
    """Hard-link a store file into the output directory (no copy of gigabytes of weights);
    copy across file systems. Editing the output in place changes the store file's mtime,
    so the store's integrity check notices and rebuilds that entry instead of serving it."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def local_inputs(build: Build) -> list[Path]:
    """Files outside the store whose content the build reads: the recipe and the recipes it
    extends, a local source model, files the stages declare, validation inputs (and their image folders)."""
    from edgebuild.verify.files import input_paths

    paths = [build.variant.path, *build.variant.includes]
    resolved = build.job.results.get("resolve")
    if resolved is not None and build.variant.recipe.source.model.split(":")[0] not in ("pypi", "https"):
        paths.append(resolved.path)
    for stage in build.job.stages:
        paths += stage.extra.get("files", [])  # e.g. a config file the frontend's options name
    return paths + input_paths(build.variant.recipe.validate_, build.variant.base_dir)


def write_depfile(path: Path, builds: list[Build]) -> str:
    """Make-format dependencies: each variant's output dir depends on its local inputs. Returns the text."""
    lines = []
    for build in builds:
        escape = lambda p: str(os.path.relpath(p)).replace(" ", "\\ ")
        lines.append(f"{escape(build.output_dir)}: " + " \\\n  ".join(escape(p) for p in local_inputs(build)))
    text = "\n".join(lines) + "\n"
    write_text_atomic(path, text)
    return text
