"""A multi-token prefill for a JAX decoder step with its KV cache explicit: the step exported with a
symbolic query length (``q <= longest``), built from a recipe whose ``generate.query_lengths`` are
an enumeration or a range, and validated by greedy generation where the prompt is fed in the
longest chunks the artifact takes, every token agreeing with JAX's own one-token-a-call loop."""

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from jax_checks import jax  # noqa: F401  (skips the module without JAX)
from jax_llama_step import Config, cache_names, export_step, greedy, random_params

NEW_TOKENS = 6


def prompts_of(lengths: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, vocab, length)] for length in lengths]


def run(recipe: Path, cache: Path) -> tuple[int, dict]:
    from rich.console import Console

    from edgebuild.build.run import run_recipes

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run_recipes([str(recipe)], cache_dir=str(cache), as_json=True, console=Console(file=io.StringIO()))
    return code, json.loads(out.getvalue())


def write_recipe(folder: Path, config: Config, params: dict, prompts: list[list[int]], *,
                 longest_query: int, query_lengths) -> Path:
    """The step exported for chunks up to ``longest_query`` and a recipe building it at fp32 and fp16
    (``query_lengths`` None: the section leaves them at their default)."""
    (folder / "step.jaxexport").write_bytes(
        bytes(export_step(config, params, longest_query=longest_query).serialize()))
    inputs, outputs = cache_names(config)
    lengths = "" if query_lengths is None else f"\n  query_lengths: {json.dumps(query_lengths)}"
    recipe = folder / "decoder.yaml"
    recipe.write_text(f"""edgebuild: 1
name: jax_prefill
source:
  model: step.jaxexport
  options:
    input_names: {json.dumps(inputs)}
    output_names: {json.dumps(outputs)}
target: {{backend: coreml, deployment_target: iOS18, precision: float16}}
compute: {{policy: cpu_and_gpu}}
generate:
  max_context: {config.max_context}{lengths}
validate:
  generation:
    prompts: {json.dumps(prompts)}
    new_tokens: {NEW_TOKENS}
  thresholds: {{token_agreement_min: 1.0, step_cosine_min: 0.9999}}
variants:
  fp32: {{target: {{precision: float32}}}}
  fp16: {{validate: {{thresholds: {{token_agreement_min: 1.0, step_cosine_min: 0.999}}}}}}
outputs: {{dir: build}}
""")
    return recipe


def query_shapes(folder: Path, variant: str) -> dict:
    """input_ids' flexible shape in the package: its enumerated shapes or its range of lengths."""
    import coremltools as ct

    spec = ct.utils.load_spec(str(folder / "build" / variant / "model.mlpackage"))
    ids = next(i for i in spec.description.input if i.name == "input_ids").type.multiArrayType
    if ids.WhichOneof("ShapeFlexibility") == "enumeratedShapes":
        return {"enumerated": sorted(list(s.shape) for s in ids.enumeratedShapes.shapes)}
    ranges = ids.shapeRange.sizeRanges
    return {"range": [[r.lowerBound, r.upperBound] for r in ranges]}


# prompt lengths that take every chunk length, whole and with one-token remainders
CASES = {
    "enumerated-1-8": ([1, 8], 8, [8, 11, 3]),
    "enumerated-1-4-16": ([1, 4, 16], 16, [16, 5, 19]),
    "range-1-16": ({"range": [1, 16]}, 16, [13, 20, 1]),
}


@pytest.mark.parametrize("case", [pytest.param("enumerated-1-8"),
                                  pytest.param("enumerated-1-4-16", marks=pytest.mark.slow),
                                  pytest.param("range-1-16", marks=pytest.mark.slow)])
def test_a_step_with_a_symbolic_query_length_prefills_and_generates_as_jax_does(tmp_path, case):
    query_lengths, longest, lengths = CASES[case]
    config = Config(layers=1)
    params = random_params(config, seed=7)
    prompts = prompts_of(lengths, config.vocab)
    recipe = write_recipe(tmp_path, config, params, prompts, longest_query=longest, query_lengths=query_lengths)
    code, result = run(recipe, tmp_path / "cache")
    assert code == 0, json.dumps(result)[:3000]
    truth = {tuple(p): tokens for p, tokens in zip(prompts, greedy(config, params, prompts, NEW_TOKENS))}
    assert [v["variant"] for v in result["variants"]] == ["fp32", "fp16"]
    for variant in result["variants"]:
        assert variant["status"] == "built", variant
        name = variant["variant"]
        validation = json.loads((tmp_path / "build" / name / "report.json").read_text())["validation"]
        assert validation["reference"] == "stablehlo (eager), greedy generation"
        assert validation["failures"] == []
        record = validation["runtimes"]["interpreter"]["generation"]
        assert record["mean_agreement"] == 1.0 and record["first_divergence"] is None, (name, record)
        assert record["worst_step_cosine"] >= (0.9999 if name == "fp32" else 0.999), (name, record)
        for prompt in record["prompts"]:
            assert prompt["source_tokens"] == truth[tuple(prompt["prompt"])], name
            assert prompt["artifact_tokens"] == prompt["source_tokens"], name
        print(f"{case} {name}: worst step cosine {record['worst_step_cosine']:.9f}")
        if isinstance(query_lengths, list):
            assert query_shapes(tmp_path, name) == {"enumerated": [[1, q] for q in sorted(query_lengths)]}
        else:
            assert query_shapes(tmp_path, name) == {"range": [[1, 1], query_lengths["range"]]}


def test_the_reference_feeds_a_prompt_in_the_chunks_the_artifact_takes(tmp_path):
    """JAX runs the symbolic step on [1, 8] and [1, 4] chunks as well as [1, 1], and its tokens are the
    one-token-a-call loop's."""
    from edgebuild.bundle.decoding import chunk_lengths
    from edgebuild.dag.step_generation import step_generator
    from edgebuild_jax.frontend import StableHLOFrontend

    config = Config(layers=1)
    params = random_params(config, seed=11)
    (tmp_path / "step.jaxexport").write_bytes(bytes(export_step(config, params, longest_query=8).serialize()))
    inputs, outputs = cache_names(config)
    generate = {"max_context": config.max_context, "query_lengths": [1, 4, 8]}
    generator = step_generator(StableHLOFrontend(), tmp_path / "step.jaxexport",
                               {"input_names": inputs, "output_names": outputs}, tmp_path, generate)
    fed, runner = [], generator.runner
    generator.runner = lambda feeds: fed.append(feeds["input_ids"].shape) or runner(feeds)
    prompts = prompts_of([13, 8, 2], config.vocab, seed=1)
    for prompt, truth in zip(prompts, greedy(config, params, prompts, 4)):
        fed.clear()
        tokens, logits = generator.generate(prompt, 4)
        assert tokens == truth
        assert logits.shape == (4, config.vocab)
        prefill = [(1, q) for q in chunk_lengths(len(prompt), [1, 4, 8])]
        assert fed == prefill + [(1, 1)] * 3, (len(prompt), fed)


def test_a_symbolic_query_length_with_query_lengths_left_at_the_default_is_refused(tmp_path):
    config = Config(layers=1)
    recipe = write_recipe(tmp_path, config, random_params(config), [[1, 2]], longest_query=8, query_lengths=None)
    code, result = run(recipe, tmp_path / "cache")
    assert code == 1
    error = result["variants"][0]["error"]
    assert "input 'input_ids' has a dynamic dim 1" in error and "generate.query_lengths" in error
    assert "source.inputs" not in error  # which a generative recipe may not name



def test_a_chunk_beyond_the_exports_constraint_is_refused_naming_the_chunk_and_the_field(tmp_path):
    from edgebuild.dag.step_generation import step_generator
    from edgebuild.errors import BuildError
    from edgebuild_jax.frontend import StableHLOFrontend

    config = Config(layers=1)
    (tmp_path / "step.jaxexport").write_bytes(bytes(export_step(config, random_params(config), longest_query=4)
                                                    .serialize()))
    inputs, outputs = cache_names(config)
    generator = step_generator(StableHLOFrontend(), tmp_path / "step.jaxexport",
                               {"input_names": inputs, "output_names": outputs}, tmp_path,
                               {"max_context": config.max_context, "query_lengths": [1, 4, 8]})
    assert generator.generate(prompts_of([4], config.vocab)[0], 2)[0]  # chunks within q <= 4 run
    with pytest.raises(BuildError) as caught:
        generator.generate(prompts_of([8], config.vocab)[0], 2)
    assert "step.jaxexport: the source's step failed on input_ids [1, 8] at position 0" in caught.value.message
    assert "generate.query_lengths" in caught.value.hint
