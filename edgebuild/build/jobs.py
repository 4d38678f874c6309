"""Recipes -> variants -> one job (a chain of stages) per variant, with its output directory checked."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgebuild.build.outputs import check_output_dir, output_location
from edgebuild.dag.executor import Job
from edgebuild.dag.source_stage import source_resolver
from edgebuild.dag.stages import artifact_of, pipeline
from edgebuild.errors import UsageError
from edgebuild.recipe import Variant, load_recipe
from edgebuild.store.local import Store


def validate_sections(variant: Variant, registry) -> None:
    """Let the plugins that own sections (compression, target.options, ...) validate them."""
    from edgebuild.recipe.sections import validate_plugin_sections

    validate_plugin_sections(variant, registry)


def load_variants(paths: list[str], only: list[str] | None, registry, matrix: dict | None = None) -> list[Variant]:
    """Every variant of every recipe (``only``: these names; ``matrix``: axes set by ``--matrix``)."""
    variants = []
    for path in paths:
        variants.extend(load_recipe(path, only=only or None, sections=lambda v: validate_sections(v, registry),
                                    matrix=matrix))
    return variants


@dataclass
class Build:
    variant: Variant
    job: Job
    output_dir: Path
    artifact: str
    written: bool = False  # the output directory was (re)written by this run
    outputs_root: Path | None = None  # outputs.dir, resolved; output_dir must stay inside it


def plan_jobs(variants: list[Variant], registry, store: Store) -> list[Build]:
    """The builds, once every output directory is known safe to replace (exit 2 otherwise,
    before any build work)."""
    builds = []
    for variant in variants:
        stages = pipeline(variant, registry, source_resolver(variant, registry, store))
        job = Job(f"{variant.recipe.name}:{variant.name}", stages)
        root, output_dir = output_location(variant)
        build = Build(variant, job, output_dir, artifact_of(stages), outputs_root=root)
        check_output_dir(build, reads=planned_inputs(build), store_root=store.root)
        builds.append(build)
    return builds


# -- output directories: edgebuild replaces only what it made ----------------------------


def planned_inputs(build: Build, source: Path | None = None) -> list[Path]:
    """Files outside the store whose content the build reads: the recipe and the recipes it
    extends, a local source model (``source`` once resolved), files the stages declare,
    validation inputs (and their image folders). Known before the build runs."""
    from edgebuild.recipe.formats import scheme_of
    from edgebuild.verify.files import input_paths

    variant = build.variant
    paths = [variant.path, *variant.includes]
    model = variant.recipe.source.model
    if source is None and scheme_of(model) == "file":
        source = variant.base_dir / model.removeprefix("file:")
    if source is not None:
        paths.append(source)
    for stage in build.job.stages:
        paths += stage.extra.get("files", [])  # e.g. a config file the frontend's options name
    return paths + input_paths(variant.recipe.validate_, variant.base_dir)


def local_inputs(build: Build) -> list[Path]:
    """``planned_inputs`` with the source the resolver found (a download is not a local input)."""
    resolved = build.job.results.get("resolve")
    downloaded = build.variant.recipe.source.model.split(":")[0] in ("pypi", "https")
    paths = planned_inputs(build, resolved.path if resolved is not None and not downloaded else None)
    if resolved is not None and not downloaded:
        paths += [resolved.path.parent / name for name in resolved.info.get("files", {})]
    return paths


