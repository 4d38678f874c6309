"""The lowered program ``edgebuild plan`` shows: from the store, or lowered into a temporary.

``edgebuild plan`` is read-only: the core's ``output_of("lower")`` takes what the store has and
builds what it lacks into a temporary directory, removed afterwards, so a plan never adds a
store entry. coremltools rewrites the Manifest.json of every package it
opens, so a package from the store is read through a copy (its other files hard-linked).
A strict policy the program breaks fails the lower stage;
its error carries the lowered program, so the plan can still show why.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

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


@contextmanager
def lowered_program(variant, output_of, artifact: str):
    """The variant's lowered program, for the duration of the ``with`` block; ``output_of`` is the
    core's (a stage's Result in a ``with`` block), ``artifact`` the package's name in the lower
    stage's output directory."""
    from edgebuild_coreml import compute as policy
    from edgebuild_coreml.interpreter import load_mlpackage

    recipe_inputs = variant.params["source"]["inputs"]
    generate = variant.params.get("generate")
    with tempfile.TemporaryDirectory(prefix="edgebuild-plan-read-") as scratch, contextlib.ExitStack() as stack:
        try:
            lowered = stack.enter_context(output_of(LOWER))
        except policy.PolicyViolation as error:
            if error.program is None:
                raise
            yield Lowered(error.program, policy.range_inputs(recipe_inputs, error.renamed_inputs), error, None,
                          policy.shape_choices(recipe_inputs, error.renamed_inputs, generate))
            return
        renamed = lowered.info.get("renamed_inputs", {})
        package = _reading_copy(lowered.path / artifact, Path(scratch))
        yield Lowered(load_mlpackage(package), policy.range_inputs(recipe_inputs, renamed), None, package,
                      policy.shape_choices(recipe_inputs, renamed, generate))
