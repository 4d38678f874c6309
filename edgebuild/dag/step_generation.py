"""The reference generator of a source whose frontend runs it as a step function with its cache
explicit (see :mod:`edgebuild.verify.runner_generation`), fed the chunks the artifact takes: a
prompt is prefilled in the longest chunks ``generate.query_lengths`` allows, as the artifact is."""

from __future__ import annotations

from pathlib import Path

from edgebuild.bundle.decoding import chunk_lengths
from edgebuild.errors import BuildError, RecipeError
from edgebuild.recipe.generate import GenerateSection, cache_pairs, derived_input_sizes
from edgebuild.verify.runner_generation import RunnerGenerator


def step_generator(frontend, source_path: Path, options, base_dir: Path, generate: dict | None):
    """A :class:`RunnerGenerator` over the frontend's reference runner, or None when it has none."""
    if not generate:
        return None
    section = GenerateSection.model_validate(generate)
    # the sizes the artifact's inputs take, for a step exported with a symbolic query length (the
    # import refused a symbolic one the recipe left at the default, so the default is given here)
    runner = frontend.reference(source_path, derived_input_sizes(section), options, base_dir)
    if runner is None:
        return None

    def pair(inputs: list[str], outputs: list[str]) -> list[tuple[str, str]]:
        try:
            return cache_pairs(section, inputs, outputs)
        except RecipeError as exc:
            raise BuildError(f"generate.cache: {exc.message}", hint=exc.hint) from None

    lengths = section.describe_lengths()
    return RunnerGenerator(runner, pair=pair, chunks=lambda count: chunk_lengths(count, lengths),
                           max_context=section.max_context, where=Path(source_path).name)
