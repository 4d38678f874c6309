"""``edgebuild.lock.json``: every stage key, its parameters, input digests and the plugin and library versions in it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgebuild.dag.stages import versions

if TYPE_CHECKING:
    from edgebuild.build.jobs import Build


def lock_data(build: Build, registry) -> dict:
    stages = {}
    for stage in build.job.stages:
        result = build.job.results.get(stage.name)
        if result is None:
            continue
        stages[stage.name] = {
            "key": result.key, "digest": result.digest, "params": stage.recorded_params(),
            "inputs": {d: build.job.results[d].digest for d in stage.deps}, "plugins": stage.plugins,
            "libraries": stage.libraries_versions,
        }
    return {
        "recipe": build.variant.recipe.name, "variant": build.variant.name,
        "versions": versions(registry), "stages": stages, "artifact": build.artifact,
        "renamings": stage_renamings(build.job.results),
    }


def stage_renamings(results) -> list[dict]:
    """The tensors the artifact names differently from the source model: the record of the last
    stage that lists them (``info["renamings"]``, written by the backend that chose the names)."""
    found: list[dict] = []
    for result in results.values():
        if isinstance(result.info.get("renamings"), list):
            found = result.info["renamings"]
    return found
