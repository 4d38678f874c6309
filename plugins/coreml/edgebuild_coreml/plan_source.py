"""The lowered program ``edgebuild plan`` shows: from the store, or built (and cached) on demand.

The stages up to ``lower`` run through the executor, so whatever they build is cached for the
next ``edgebuild run``. A strict policy that the program breaks fails the lower stage; the plan
still has to show why, so then the program is lowered once more without the policy check, into
a temporary directory.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from edgebuild.dag.executor import Executor, Job

LOWER = "lower"


def _stages_through(stages, name: str):
    names = [stage.name for stage in stages]
    if name not in names:
        return None
    return stages[: names.index(name) + 1]


def lowered_program(backend, build, store, registry):
    """(pymil Program of the variant's lowered artifact, MIL names of range inputs, policy error or None)."""
    from edgebuild_coreml import compute as policy
    from edgebuild_coreml.backend import ARTIFACT
    from edgebuild_coreml.interpreter import load_mlpackage

    recipe_inputs = build.variant.recipe.model_dump(mode="json", by_alias=True)["source"]["inputs"]
    stages = _stages_through(build.job.stages, LOWER)
    job = Job(f"{build.job.label} (plan)", stages)
    Executor(store).run([job])
    if job.error is None:
        lowered = job.results[LOWER]
        renamed = lowered.info.get("renamed_inputs", {})
        return load_mlpackage(lowered.path / ARTIFACT), policy.range_inputs(recipe_inputs, renamed), None
    if not isinstance(job.error, policy.PolicyViolation):
        raise job.error
    # The strict policy failed the stage: lower again without the check, to plan it anyway.
    with tempfile.TemporaryDirectory(prefix="edgebuild-plan-") as scratch:
        artifact = Path(scratch) / ARTIFACT
        info = backend.lower_stage_body(build.variant, registry)(job.results, artifact.parent, enforce_policy=False)
        program = load_mlpackage(artifact)  # weights are read into memory, the directory can go
    return program, policy.range_inputs(recipe_inputs, info.get("renamed_inputs", {})), job.error
