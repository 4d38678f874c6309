"""The validate stage, which the core owns: the artifact's candidates (a backend's runtimes) against
the reference that evaluates the source (:func:`edgebuild.verify.reference.choose_reference`).

The pipeline appends it to a variant whose recipe has ``validate:`` (:func:`validate_stage_of`); its
parameters are :class:`ValidateParams` and its body :func:`validate_stage`, which writes
``validation.json`` (the report's ``validation`` record). The comparison itself is :func:`validate`
(one candidate at a time, samples in threads) and, for generative recipes, :func:`generation_validation`.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from edgebuild.errors import BuildError
from edgebuild.recipe.formats import source_format
from edgebuild.threads import WORKERS_ENV, blas_threads, cpu_threads, requested_sample_workers  # noqa: F401
from edgebuild.verify.reference import QUANTISED_OPS, onnxruntime_runner, quantises_activations  # noqa: F401
from edgebuild.dag.validate_stage import generate_section
from edgebuild.verify.specs import onnx_input_specs

Runner = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]

def sample_workers(samples: int) -> int:
    """How many samples to run at once: one per core, at most two (each holds its activations),
    or ``$EDGEBUILD_VALIDATE_WORKERS``."""
    workers = requested_sample_workers()
    if workers is None:
        workers = min(2, cpu_threads())
    return max(1, min(workers, samples))


def map_samples(fn: Callable, samples: list, *, parallel: bool = True, workers: int | None = None,
                on_done: Callable[[int], None] | None = None) -> list:
    """``[fn(s) for s in samples]``, a few samples at a time in threads when ``parallel``
    (``workers`` at most when given, else ``sample_workers``); ``on_done(n)`` is called in the
    caller's thread as the first ``n`` results are in.

    numpy and onnxruntime release the GIL in their kernels, so threads share the cores without
    copying a model into other processes. Each sample's BLAS calls run on one thread meanwhile
    (threadpoolctl, when installed): two samples with a BLAS pool each would oversubscribe the
    cores. A runner that must not be called concurrently is validated with ``parallel=False``.
    """
    if not parallel:
        workers = 1
    else:
        workers = sample_workers(len(samples)) if workers is None else max(1, min(workers, len(samples)))
    results: list = []

    def collect(outcomes) -> list:
        for outcome in outcomes:
            results.append(outcome)
            if on_done is not None:
                on_done(len(results))
        return results

    if workers == 1:
        return collect(fn(sample) for sample in samples)
    from concurrent.futures import ThreadPoolExecutor

    with blas_threads(1), ThreadPoolExecutor(workers, thread_name_prefix="validate") as pool:
        return collect(pool.map(fn, samples))


def calls_of(runner: Runner, samples: int, workers: int) -> tuple[Callable[[list], list], int]:
    """``(run_many, size)``: a function from a list of samples to their outputs, and how many
    samples to hand it at a time so that ``workers`` calls share ``samples`` evenly. A runner that
    runs several samples faster at once (the MIL interpreter) offers ``runner.run_many(samples)``
    and ``runner.samples_per_call``; any other is called once per sample."""
    many = getattr(runner, "run_many", None)
    if many is None:
        return (lambda chunk: [runner(sample) for sample in chunk]), 1
    per_worker = -(-samples // max(workers, 1))
    return many, max(1, min(int(getattr(runner, "samples_per_call", 1)), per_worker))


def in_chunks(items: list, size: int) -> list[list]:
    return [items[start:start + size] for start in range(0, len(items), size)]


@contextlib.contextmanager
def sample_runner(runner: Runner, samples: int, *, parallel: bool = True):
    """``(run, workers)``: ``runner`` (or a stand-in for it) and how many samples ``map_samples``
    should run at once with it. A runner with Python between its kernels (the MIL interpreter)
    gains nothing from threads, which take turns on the GIL: it may offer
    ``runner.samples_in_parallel(workers[, samples])``, a context manager giving ``(run, workers)``
    of its own choosing (its calls run in worker processes, or one at a time where a sample is too
    small to be worth shipping; ``samples``, when it takes it: how many are coming), which stops
    whatever it started when the block ends."""
    workers = sample_workers(samples) if parallel else 1
    offer = getattr(runner, "samples_in_parallel", None)
    if workers == 1 or offer is None:
        yield runner, workers
        return
    # how many samples are coming, for a runner that weighs starting processes against them
    told = {"samples": samples} if "samples" in inspect.signature(offer).parameters else {}
    with offer(workers, **told) as chosen:
        yield chosen


def validate(section, source_path: Path, recipe_inputs: dict, candidate: Runner, base_dir: Path,
             candidate_name: str = "interpreter", *, reference: Runner | None = None, specs: dict | None = None,
             reference_name: str = "onnxruntime", parallel: bool = True) -> dict:
    """Run both sides on the recipe's inputs; return the report's ``validation`` record: what
    :func:`measure` measures, judged by the section's limits (:func:`edgebuild.dag.verdict.judge`)."""
    from edgebuild.dag.verdict import judge

    drawn = draw_samples(section, source_path, recipe_inputs, base_dir, specs=specs, reference=reference)
    measured = measure(section, drawn, candidate, candidate_name, reference_name=reference_name, parallel=parallel)
    return judge(measured, section, diagnose=lambda runtime, failures, per_sample: float64_diagnosis(
        drawn, reference_name, candidate, failures, per_sample))


@dataclass
class DrawnSamples:
    """The recipe's input samples of a source and the reference they are held to."""

    source_path: Path
    samples: list  # every sample: {input name: array} of the inputs the recipe leaves free
    sets: list  # per shape set: (input shapes, index of its first sample, count)
    fixed: dict  # the inputs with a fixed value, fed with every sample
    reference: Runner


def draw_samples(section, source_path: Path, recipe_inputs: dict, base_dir: Path, *, specs: dict | None = None,
                 reference: Runner | None = None) -> DrawnSamples:
    """The samples ``validate.samples`` and ``validate.inputs`` ask for, at each shape set the recipe's
    flexible inputs are validated at (``verify.shapes``), and the reference (default: onnxruntime)."""
    from edgebuild.verify.inputs import generate_inputs
    from edgebuild.verify.shapes import shape_sets

    specs = specs if specs is not None else onnx_input_specs(source_path, recipe_inputs)
    fixed = {n: np.asarray(s["value"], dtype=s["dtype"]).reshape(s["shape"]) for n, s in specs.items() if "value" in s}
    samples, sets = [], []
    for one in shape_sets(specs, recipe_inputs):
        free = {n: s for n, s in one.items() if "value" not in s}
        drawn = generate_inputs(section, free, base_dir)
        sets.append(({n: list(s["shape"]) for n, s in free.items()}, len(samples), len(drawn)))
        samples += drawn
    if not samples:  # nothing compared is not a pass
        raise BuildError("validate: no input samples were produced, so nothing was compared",
                         hint="check validate.samples and that validate.inputs' folders and files hold data")
    if reference is None:
        from edgebuild.verify.reference import onnxruntime_runner

        reference = onnxruntime_runner(source_path)
    return DrawnSamples(source_path, samples, sets, fixed, reference)


def measure(section, drawn: DrawnSamples, candidate: Runner, candidate_name: str = "interpreter", *,
            reference_name: str = "onnxruntime", parallel: bool = True) -> dict:
    """The candidate against the reference on ``drawn``, unjudged (no limit is read): per runtime the
    aggregated metrics, the error histograms and, for each distance metric, the sample it was worst
    on (where a failed limit is checked against float64); with several shape sets, ``shapes`` lists
    them with the lowest cosine per output there. ``parallel``: the candidate may run several
    samples at once (see ``map_samples``)."""
    from edgebuild.progress import report
    from edgebuild.verify.float64 import float64_truth
    from edgebuild.verify.metrics import (
        aggregate,
        compare,
        compare_with_float64,
        error_histogram,
        merge_histograms,
    )

    samples, fixed, reference = drawn.samples, drawn.fixed, drawn.reference
    truth, evaluator = (float64_truth(drawn.source_path, reference_name, reference) if section.reference == "float64"
                        else (None, None))

    detections = getattr(section, "detections", ())  # matched box by box (verify.detections)

    def compare_one(sample, cand):
        feed = {**sample, **fixed}
        ref = reference(feed)
        if truth is None:
            return compare(ref, cand, detections=detections), error_histogram(ref, cand, skip=detections)
        exact = truth(feed)
        return (compare_with_float64(exact, ref, cand, detections=detections),
                error_histogram(exact, cand, skip=detections))

    with sample_runner(candidate, len(samples), parallel=parallel) as (run_candidate, workers):
        run_many, size = calls_of(run_candidate, len(samples), workers)
        chunks = in_chunks(samples, size)
        compared = map_samples(lambda chunk: list(map(compare_one, chunk, run_many(chunk))), chunks,
                               parallel=parallel, workers=workers,
                               on_done=lambda n: report(f"samples validated ({candidate_name})",
                                                        min(n * size, len(samples)), len(samples)))
    compared = [one for chunk in compared for one in chunk]
    per_sample = [metrics for metrics, _ in compared]
    record = {"metrics": aggregate(per_sample), "histograms": merge_histograms([h for _, h in compared]),
              "worst_samples": _worst_samples(per_sample)}
    result = {
        "samples": len(samples),
        "reference": reference_name if truth is None else f"float64 ({evaluator})",
        "runtimes": {candidate_name: record},
    }
    if len(drawn.sets) > 1:
        result["shapes"] = [{"inputs": shapes, "samples": count,
                             "cosine_min": {candidate_name: _lowest_cosine(per_sample[first:first + count])}}
                            for shapes, first, count in drawn.sets]
    return result


def _worst_samples(per_sample: list) -> dict[str, dict[str, list]]:
    """``{output: {metric: [sample, value]}}``: the sample each distance metric was worst on."""
    from edgebuild.verify.diagnose import DISTANCE_METRICS, worst_sample
    from edgebuild.verify.thresholds import Failure

    outputs = dict.fromkeys(output for metrics in per_sample for output in metrics)
    worst: dict[str, dict[str, list]] = {}
    for output in outputs:
        for metric in DISTANCE_METRICS:
            if any(metric in metrics.get(output, {}) for metrics in per_sample):
                index = worst_sample(Failure(output, metric, None, None, ""), per_sample)
                worst.setdefault(output, {})[metric] = [index, per_sample[index].get(output, {}).get(metric, math.nan)]
    return worst


def float64_diagnosis(drawn: DrawnSamples, reference_name: str, candidate: Runner, failures: list,
                      per_sample: list) -> dict | None:
    """The float64 check of a failed distance limit (``edgebuild.verify.diagnose.float64_check``) on
    ``drawn``'s worst sample, as ``per_sample`` tells it."""
    from edgebuild.verify.diagnose import float64_check

    return float64_check(drawn.source_path, reference_name, failures, per_sample, drawn.samples, drawn.fixed,
                         drawn.reference, candidate)


def _lowest_cosine(per_sample: list) -> dict[str, float]:
    """output -> the lowest cosine over these samples (outputs without one are left out)."""
    lowest: dict[str, float] = {}
    for metrics in per_sample:
        for output, values in metrics.items():
            cosine = values.get("cosine")
            if cosine is not None and np.isfinite(cosine):
                lowest[output] = min(lowest.get(output, float(cosine)), float(cosine))
    return lowest


def merge_runtime(record: dict, one: dict) -> None:
    """Add one runtime's ``validate`` result to ``record`` (the same samples, another candidate)."""
    record["samples"], record["reference"] = one["samples"], one["reference"]
    record["runtimes"].update(one["runtimes"])
    if "failures" in one:  # a judged record (a measured one has none yet)
        record["failures"] += one["failures"]
    if "shapes" in one:
        if "shapes" not in record:
            record["shapes"] = [{**entry, "cosine_min": {}} for entry in one["shapes"]]
        for mine, theirs in zip(record["shapes"], one["shapes"]):
            mine["cosine_min"].update(theirs["cosine_min"])


def save(out: Path, record: dict) -> dict:
    from edgebuild.report.write import to_jsonable

    (out / "validation.json").write_text(json.dumps(to_jsonable(record), indent=1))
    return to_jsonable(record)


# -- generative recipes (generate:): validation by greedy generation, see verify/generation.py --

def source_generator(registry, variant, source_path: Path):
    """``(generator, name)`` of a variant's source (see :func:`generator_of`)."""
    fmt = source_format(variant.recipe.source)
    return generator_of(registry, fmt, variant.section(f"{fmt}:source.options"), variant.base_dir, source_path,
                        generate_section(variant))


def generator_of(registry, fmt: str, options, base_dir: Path, source_path: Path, generate: dict | None):
    """``(generator, name)`` of the source: the source format's frontend's ``generator`` (PyTorch: the
    eager module with its own cache), else its reference runner stepped with the cache explicit (a
    JAX step function), else for ONNX onnxruntime with the explicit cache."""
    frontend = registry.get("frontends", fmt) if registry is not None else None
    if frontend is not None:
        generator = frontend.generator(source_path, options, base_dir)
        if generator is None and fmt != "onnx":
            from edgebuild.dag.step_generation import step_generator

            generator = step_generator(frontend, source_path, options, base_dir, generate)
        if generator is not None:
            return generator, f"{fmt} (eager)"
    if fmt == "onnx":
        from edgebuild.verify.source_generation import OnnxGenerator

        cache = (generate or {}).get("cache")
        pairs = [(pair["input"], pair["output"]) for pair in cache] if isinstance(cache, list) else None
        return OnnxGenerator(source_path, cache=pairs), "onnxruntime"
    raise BuildError(f"validate.generation: the {fmt} frontend offers no generator for its source, so the artifact's "
                     "generation has nothing to be compared with",
                     hint=f"update the plugin that reads {fmt} sources, or remove validate.generation")


def validate_generation(variant, registry, source_path: Path, sessions: Mapping[str, Callable[[], object]], *,
                        source: tuple | None = None) -> dict:
    """:func:`generation_validation` for a variant; ``source``: ``(generator, name)`` instead of its own."""
    return generation_validation(variant.recipe.validate_, generate_section(variant), variant.base_dir, sessions,
                             source or source_generator(registry, variant, source_path))


def generation_validation(section, generate: dict | None, base_dir: Path, sessions: Mapping[str, Callable[[], object]],
                      source: tuple) -> dict:
    """The ``validation`` record of a generative recipe: :func:`measure_generation`, judged by
    ``token_agreement_min`` / ``step_cosine_min`` (:func:`edgebuild.dag.verdict.judge`)."""
    from edgebuild.dag.verdict import judge

    return judge(measure_generation(section, generate, base_dir, sessions, source), section)


def measure_generation(section, generate: dict | None, base_dir: Path, sessions: Mapping[str, Callable[[], object]],
                       source: tuple) -> dict:
    """Each runtime's session (``sessions``: runtime name -> a function opening the artifact's
    ``InferenceSession``) and the source (``(generator, name)``) generate greedily from
    ``validate.generation.prompts``; per runtime, each prompt's comparison (tokens, per-step logits
    cosine), unjudged."""
    from dataclasses import asdict

    from edgebuild.progress import report
    from edgebuild.verify.generation import SessionGenerator, compare_generation, prompt_ids

    generation = section.generation if section is not None else None
    if generation is None:
        raise BuildError("validate: a generative recipe (generate:) is validated by generation, and "
                         "validate.generation is missing",
                         hint="add validate.generation: {prompts: [[token ids], ...], new_tokens: 16}")
    prompts, texts = prompt_ids(generation, base_dir)
    _check_context(prompts, generation.new_tokens, generate or {})
    source, source_name = source
    source = _Remembered(source)  # every runtime is compared with the same source generations
    record: dict = {"samples": len(prompts), "reference": f"{source_name}, greedy generation", "runtimes": {}}
    for runtime, open_session in sessions.items():
        compared = compare_generation(SessionGenerator(open_session()), source, prompts, generation.new_tokens,
                                      texts=texts,
                                      on_done=lambda n, r=runtime: report(f"prompts generated ({r})", n, len(prompts)))
        record["runtimes"][runtime] = {"comparison": {"new_tokens": compared.new_tokens,
                                                      "prompts": [asdict(p) for p in compared.prompts]}}
    return record


def _check_context(prompts: list[list[int]], new_tokens: int, generate: dict) -> None:
    max_context = generate.get("max_context")
    longest = max(len(p) for p in prompts)
    if isinstance(max_context, int) and longest + new_tokens > max_context:
        raise BuildError(f"validate.generation: the longest prompt ({longest} tokens) plus new_tokens ({new_tokens}) "
                         f"exceeds generate.max_context ({max_context})",
                         hint="shorten the prompts, lower validate.generation.new_tokens or raise generate.max_context")


class _Remembered:
    """A generator that answers a repeated prompt from memory (the source is deterministic)."""

    def __init__(self, generator):
        self.generator = generator
        self._seen: dict = {}

    def generate(self, prompt_ids: list[int], new_tokens: int):
        key = (tuple(prompt_ids), new_tokens)
        if key not in self._seen:
            self._seen[key] = self.generator.generate(list(prompt_ids), new_tokens)
        return self._seen[key]
