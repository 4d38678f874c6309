"""A JAX decoder step's prompt prefilled in one call against one token a call, in one run.

The model is the JAX frontend tests' Llama-style step (plugins/jax/tests/jax_llama_step.py: 2 layers,
hidden 64, grouped-query attention, 64-token cache, seeded weights), exported twice with the same
weights: for ``input_ids`` [1, 1] (``generate.query_lengths`` [1]) and for a symbolic query length
``q <= 32`` (``query_lengths`` [1, 32]). Both are built by ``edgebuild run`` (fp32, validated by
greedy generation against JAX, which must agree on every token), then each side's greedy generation
of a 32-token prompt and 8 new tokens is timed: the package on edgebuild's MIL interpreter, and JAX
running the export, each stepped as validation steps it. Times are the fastest of ``--repeats`` runs
after one untimed warm-up, the four generators taking turns in every round (so a change in the
machine's load falls on all); the ratio is one-token-a-call over prefill, measured in the same run.

    python benchmarks/jax_prefill.py [--repeats N] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins" / "jax" / "tests"))

PROMPT_LENGTH, NEW_TOKENS, LONGEST = 32, 8, 32


def recipe_text(inputs: list[str], outputs: list[str], query_lengths: list[int], prompt: list[int],
                max_context: int) -> str:
    return f"""edgebuild: 1
name: prefill
source:
  model: step.jaxexport
  options:
    input_names: {json.dumps(inputs)}
    output_names: {json.dumps(outputs)}
target: {{backend: coreml, deployment_target: iOS18, precision: float32}}
compute: {{policy: cpu_and_gpu}}
generate:
  max_context: {max_context}
  query_lengths: {json.dumps(query_lengths)}
validate:
  generation:
    prompts: [{json.dumps(prompt)}]
    new_tokens: {NEW_TOKENS}
  thresholds: {{token_agreement_min: 1.0, step_cosine_min: 0.9999}}
outputs: {{dir: build}}
"""


def build(folder: Path, exported, config, query_lengths: list[int], prompt: list[int]) -> Path:
    """The package of one export, built and validated; its path."""
    from rich.console import Console

    from edgebuild.build.run import run_recipes
    from jax_llama_step import cache_names

    folder.mkdir(parents=True)
    (folder / "step.jaxexport").write_bytes(bytes(exported.serialize()))
    (folder / "recipe.yaml").write_text(recipe_text(*cache_names(config), query_lengths, prompt, config.max_context))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run_recipes([str(folder / "recipe.yaml")], cache_dir=str(folder / "cache"), as_json=True,
                           console=Console(file=io.StringIO()))
    if code != 0:
        raise SystemExit(f"the build of query_lengths {query_lengths} failed: {out.getvalue()[:2000]}")
    return folder / "build" / "default" / "model.mlpackage"


def interleaved(generators: dict, prompt: list[int], repeats: int) -> dict:
    """Each generator's fastest of ``repeats`` generations, the generators taking turns in every
    round so a change in the machine's load falls on all of them; after one untimed warm-up each
    (compilation, first-call caches). Every run must give the warm-up's tokens."""
    tokens = {name: generate(prompt, NEW_TOKENS)[0] for name, generate in generators.items()}
    seconds: dict = {name: [] for name in generators}
    for _ in range(repeats):
        for name, generate in generators.items():
            start = time.perf_counter()
            again, _ = generate(prompt, NEW_TOKENS)
            seconds[name].append(time.perf_counter() - start)
            assert again == tokens[name], name
    return {name: (min(times), tokens[name]) for name, times in seconds.items()}


def measure(repeats: int) -> dict:
    import numpy as np

    from edgebuild.dag.step_generation import step_generator
    from edgebuild.registry import get_registry
    from edgebuild.verify.generation import SessionGenerator
    from edgebuild_jax.frontend import StableHLOFrontend
    from jax_llama_step import Config, cache_names, export_step, random_params

    config = Config(max_context=64)
    params = random_params(config, seed=0)
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, config.vocab, PROMPT_LENGTH)]
    inputs, outputs = cache_names(config)
    registry = get_registry()
    rows, generators = {}, {}
    with tempfile.TemporaryDirectory(prefix="jax-prefill.") as scratch:
        for name, longest, query_lengths in (("one token a call", None, [1]), ("prefill", LONGEST, [1, LONGEST])):
            folder = Path(scratch) / name.replace(" ", "-")
            package = build(folder, export_step(config, params, longest_query=longest), config, query_lengths, prompt)
            (open_session,) = registry.get("backends", "coreml").sessions(package, ("interpreter",),
                                                                         registry=registry).values()
            reference = step_generator(StableHLOFrontend(), folder / "step.jaxexport",
                                       {"input_names": inputs, "output_names": outputs}, folder,
                                       {"max_context": config.max_context, "query_lengths": query_lengths})
            generators[(name, "interpreter")] = SessionGenerator(open_session()).generate
            generators[(name, "jax")] = reference.generate
            rows[name] = {"query_lengths": query_lengths,
                          "calls": len(reference.chunks(PROMPT_LENGTH)) + NEW_TOKENS - 1}
        for (name, side), (seconds, tokens) in interleaved(generators, prompt, repeats).items():
            rows[name][f"{side}_seconds"] = seconds
            if rows[name].setdefault("tokens", tokens) != tokens:
                raise SystemExit(f"{name}: the package and JAX generate differently")
    one, prefill = rows["one token a call"], rows["prefill"]
    if one["tokens"] != prefill["tokens"]:
        raise SystemExit(f"the two exports generate differently: {one['tokens']} vs {prefill['tokens']}")
    return {"prompt_tokens": PROMPT_LENGTH, "new_tokens": NEW_TOKENS, "repeats": repeats, "rows": rows,
            "ratios": {"interpreter": one["interpreter_seconds"] / prefill["interpreter_seconds"],
                       "jax": one["jax_seconds"] / prefill["jax_seconds"]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    result = measure(args.repeats)
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['prompt_tokens']}-token prompt, {result['new_tokens']} new tokens, fastest of {args.repeats}")
    print(f"{'':18} {'calls':>5} {'interpreter s':>14} {'JAX s':>8}")
    for name, row in result["rows"].items():
        print(f"{name:18} {row['calls']:>5} {row['interpreter_seconds']:>14.3f} {row['jax_seconds']:>8.3f}")
    ratios = result["ratios"]
    print(f"one token a call / prefill: interpreter {ratios['interpreter']:.2f}x, JAX {ratios['jax']:.2f}x")


if __name__ == "__main__":
    main()
