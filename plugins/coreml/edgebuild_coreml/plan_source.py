"""The lowered program ``edgebuild plan`` shows: from the store, or built (and cached) on demand.

The stages up to ``lower`` run through the executor, so whatever they build is cached for the
next ``edgebuild run``. A strict policy the program breaks fails the lower stage; its error
carries the lowered program, so the plan can still show why.
"""

from __future__ import annotations

from edgebuild.dag.executor import Executor, Job

LOWER = "lower"


def _stages_through(stages, name: str):
    names = [stage.name for stage in stages]
    return stages[: names.index(name) + 1]


def lowered_program(build, store, *, with_path: bool = False):
    """(pymil Program of the variant's lowered artifact, MIL names of range inputs, policy error or None),
    plus the artifact's path (None when the lower stage failed) with ``with_path``."""
    from edgebuild_coreml import compute as policy
    from edgebuild_coreml.backend import ARTIFACT
    from edgebuild_coreml.interpreter import load_mlpackage

    recipe_inputs = build.variant.recipe.model_dump(mode="json", by_alias=True)["source"]["inputs"]
    job = Job(f"{build.job.label} (plan)", _stages_through(build.job.stages, LOWER))
    Executor(store).run([job])
    if job.error is None:
        lowered = job.results[LOWER]
        renamed = lowered.info.get("renamed_inputs", {})
        found = load_mlpackage(lowered.path / ARTIFACT), policy.range_inputs(recipe_inputs, renamed), None
        return (*found, lowered.path / ARTIFACT) if with_path else found
    error = job.error
    if isinstance(error, policy.PolicyViolation) and error.program is not None:
        found = error.program, policy.range_inputs(recipe_inputs, error.renamed_inputs), error
        return (*found, None) if with_path else found
    raise error
