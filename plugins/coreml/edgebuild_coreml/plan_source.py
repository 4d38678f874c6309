"""The lowered program ``edgebuild plan`` shows: from the store, or lowered into a temporary.

``edgebuild plan`` is read-only: the stages up to ``lower`` run through an executor that takes
what the store has and builds what it lacks into a temporary directory, removed afterwards,
so a plan never adds a store entry. coremltools rewrites the Manifest.json of every package it
opens, so a package from the store is read through a copy (its other files hard-linked).
A strict policy the program breaks fails the lower stage;
its error carries the lowered program, so the plan can still show why.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from edgebuild.dag.executor import Executor, Job

LOWER = "lower"


@dataclass
class Lowered:
    program: object  # pymil Program of the variant's lowered artifact
    shapes_dynamic: set[str]  # MIL names of the inputs with a range dim
    error: Exception | None  # the strict-policy error the lower stage raised, if any
    artifact: Path | None  # the lowered package (None when the lower stage failed); valid inside the block
    enumerated: list[dict] = field(default_factory=list)  # {MIL input: shape} per enumerated-shape choice


def _reading_copy(package: Path, scratch: Path) -> Path:
    def link_or_copy(src, dst):
        if Path(src).name == "Manifest.json":
            return shutil.copy2(src, dst)
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    copy = Path(tempfile.mkdtemp(prefix="read-", dir=scratch)) / package.name
    shutil.copytree(package, copy, copy_function=link_or_copy)
    return copy


def _stages_through(stages, name: str):
    names = [stage.name for stage in stages]
    return stages[: names.index(name) + 1]


@contextmanager
def lowered_program(build, store, artifact: str):
    """The variant's lowered program, for the duration of the ``with`` block; ``artifact`` is the
    package's name in the lower stage's output directory."""
    from edgebuild_coreml import compute as policy
    from edgebuild_coreml.interpreter import load_mlpackage

    recipe_inputs = build.variant.params["source"]["inputs"]
    generate = build.variant.params.get("generate")
    with tempfile.TemporaryDirectory(prefix="edgebuild-plan-") as scratch:
        job = Job(f"{build.job.label} (plan)", _stages_through(build.job.stages, LOWER))
        Executor(store, scratch=Path(scratch)).run([job])
        if job.error is None:
            lowered = job.results[LOWER]
            renamed = lowered.info.get("renamed_inputs", {})
            package = _reading_copy(lowered.path / artifact, Path(scratch))
            yield Lowered(load_mlpackage(package), policy.range_inputs(recipe_inputs, renamed), None, package,
                          policy.shape_choices(recipe_inputs, renamed, generate))
            return
        error = job.error
        if isinstance(error, policy.PolicyViolation) and error.program is not None:
            yield Lowered(error.program, policy.range_inputs(recipe_inputs, error.renamed_inputs), error, None,
                          policy.shape_choices(recipe_inputs, error.renamed_inputs, generate))
            return
        raise error
