"""Validation speed: the MIL interpreter on edgebuild's packages against onnxruntime on the source.

For each recipe in ``recipes/`` naming one of the real ONNX models, the recipe's fp32 and fp16
variants are built through edgebuild's own pipeline (import .. package, cached in the benchmark's
store; the validate stage is left out), then one process times, per sample and over the same
inputs (the recipe's own validation inputs):

- onnxruntime (CPU, 2 intra-op threads) on the source model;
- the interpreter on the fp32 package, through the runner the validate stage uses;
- the interpreter on the fp16 package, as the validate stage runs it (the recipe's
  ``fp16_emulation``: an fp16 artifact computes in its own typed fp16);
- the interpreter on both packages again with samples run exactly as the validate stage runs
  them (``edgebuild.dag.validate.sample_runner`` told how many samples are coming, then
  ``map_samples`` over ``calls_of`` chunks): in the build's own process first, worker processes
  started only when the samples left would pay for them (``_LocalFirst`` in the interpreter's
  ``artifact_runner``): wall time / samples, a fresh sample runner each round as each stage makes one;
- the same with the worker processes started at once (``$EDGEBUILD_VALIDATE_WORKERS=2``): their
  steady state, and their start apart;
- the whole sample loop of the validate stage on the fp32 package (every sample, with its
  reference and metrics).

Each runner is warmed up on one sample (a first call loads and prepares), then the median time
over ``--samples`` samples is reported, with ratios interp/ort and fp16/fp32. onnxruntime and the
validate stage's runs take turns for ``--rounds`` rounds, each keeping its best round: on a
shared machine a slow spell of a few seconds would otherwise land on one side of a ratio alone.
Each row records the machine's load average before and after it (``load_before``, ``load_after``).

The targets (interpreter fp32 at most 3x onnxruntime, fp16 emulation at most 2x fp32) are read
on the "as the validate stage runs them" columns: the stage's wall time / samples
(``stage_over_ort`` and ``stage_fp16_over_fp32`` in ``--json``), against onnxruntime's per-sample
median with 2 intra-op threads, all measured in one run (the machine may be shared: compare
ratios, not milliseconds across runs). The one-at-a-time columns leave BLAS its default thread
pool, which on a busy 2-core machine can cost the interpreter's many small matmuls several times
their single-threaded time; they are shown for the kernels, not the target.

    python benchmarks/validate.py [--models ddddocr_det,orientation] [--samples 8] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ("orientation", "ppocr_cls", "ddddocr_det", "minilm_paraphrase", "minilm_int8", "silero_vad")
ORT_THREADS = 2


def build_package(recipe: str, variant: str, cache: str):
    """Build ``recipe:variant`` up to its package; (Variant, artifact path, lower stage info)."""
    from edgebuild.build.jobs import load_variants, plan_jobs
    from edgebuild.store.location import open_store
    from edgebuild.dag.executor import Executor
    from edgebuild.registry import get_registry

    registry = get_registry()
    [build] = plan_jobs(load_variants([recipe], [variant], registry), registry, open_store(cache))
    build.job.stages = [s for s in build.job.stages if s.name != "validate"]
    Executor(open_store(cache)).run([build.job])
    if build.job.error is not None:
        raise SystemExit(f"{recipe}:{variant}: build failed: {build.job.error}")
    results = build.job.results
    return build.variant, results["package"].path / build.artifact, results["lower"].info, results["resolve"].path


def ort_runner(source: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = ORT_THREADS
    session = ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return lambda inputs: session.run(None, {n: inputs[n] for n in names if n in inputs})


def interpreter_runner(variant, artifact: Path, lowered: dict):
    from edgebuild.registry import get_registry

    backend = get_registry().get("backends", "coreml")
    section = variant.recipe.validate_
    return backend.runner(artifact, variant.recipe.target.precision, lowered=lowered,
                          emulate_fp16=section.fp16_emulation == "on")


def per_sample_ms(run, samples: list[dict]) -> float:
    """Median wall time of ``run`` per sample, after one warm-up call."""
    run(samples[0])
    times = []
    for sample in samples:
        start = time.perf_counter()
        run(sample)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def stage_ms(runner, samples: list[dict]) -> float:
    """Wall time per sample of ``runner`` over every sample, run as the validate stage runs them
    (see ``edgebuild.dag.validate.validate``): a sample runner told how many are coming, which
    starts worker processes only when those would pay for themselves, left at the end."""
    from edgebuild.dag.validate import calls_of, in_chunks, map_samples, sample_runner

    start = time.perf_counter()
    with sample_runner(runner, len(samples)) as (run, workers):
        run_many, size = calls_of(run, len(samples), workers)
        map_samples(run_many, in_chunks(samples, size), workers=workers)
    return (time.perf_counter() - start) * 1000 / len(samples)


@contextlib.contextmanager
def worker_runs(runners: dict, samples: list[dict]):
    """``run(name) -> ms``: wall time per sample of runner ``name`` over every sample with its
    worker processes started at once (``$EDGEBUILD_VALIDATE_WORKERS``), their steady state. Every
    runner's workers are started and warmed up on entry (a few calls each); the first of them's
    start time, in ms, is ``run.start_ms`` (the workers' start, their reading and planning the
    package)."""
    from edgebuild.dag.validate import calls_of, in_chunks, map_samples, sample_runner

    with contextlib.ExitStack() as stack:
        pooled, start_ms = {}, None
        for name, runner in runners.items():
            start = time.perf_counter()
            with _environment(EDGEBUILD_VALIDATE_WORKERS="2"):
                run, workers = stack.enter_context(sample_runner(runner, len(samples)))
            run_many, size = calls_of(run, len(samples), workers)
            map_samples(run_many, [samples[:size]] * 2 * workers, workers=workers)  # every worker has run, likely
            pooled[name] = run_many, in_chunks(samples, size), workers
            start_ms = (time.perf_counter() - start) * 1000 if start_ms is None else start_ms

        def timed(name: str) -> float:
            run_many, chunks, workers = pooled[name]
            start = time.perf_counter()
            map_samples(run_many, chunks, workers=workers)
            return (time.perf_counter() - start) * 1000 / len(samples)

        timed.start_ms = start_ms
        yield timed


@contextlib.contextmanager
def _environment(**values: str):
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def validate_loop_ms(variant, source: Path, runner, samples: int) -> float:
    """The validate stage's whole sample loop (reference + candidate + metrics), per sample."""
    from edgebuild.dag.validate import validate
    from edgebuild.recipe.formats import source_format
    from edgebuild.registry import get_registry
    from edgebuild.verify.reference import choose_reference

    dump = variant.recipe.model_dump(mode="json", by_alias=True)
    section = variant.recipe.validate_.model_copy(update={"samples": samples})
    fmt = source_format(variant.recipe.source)
    reference = choose_reference(source, get_registry(), fmt=fmt, inputs=dump["source"]["inputs"],
                                 options=variant.section(f"{fmt}:source.options"), base_dir=variant.base_dir,
                                 section=section)
    start = time.perf_counter()
    validate(section, source, dump["source"]["inputs"], runner, variant.base_dir, reference=reference.runner,
             specs=reference.specs, reference_name=reference.name)
    return (time.perf_counter() - start) * 1000 / samples


def measure(name: str, samples: int, cache: str, loop: bool, workers: bool, rounds: int) -> dict:
    from edgebuild.verify.specs import onnx_input_specs
    from edgebuild.verify.inputs import generate_inputs

    recipe = str(ROOT / "recipes" / f"{name}.yaml")
    fp32, artifact32, lowered32, source = build_package(recipe, "fp32", cache)
    fp16, artifact16, lowered16, _ = build_package(recipe, "fp16", cache)
    specs = onnx_input_specs(source, fp32.recipe.model_dump(mode="json")["source"]["inputs"])
    fixed = {n: s for n, s in specs.items() if "value" in s}
    free = {n: s for n, s in specs.items() if "value" not in s}
    section = fp32.recipe.validate_.model_copy(update={"samples": samples})
    inputs = generate_inputs(section, free, fp32.base_dir)
    import numpy as np

    for sample in inputs:
        sample.update({n: np.asarray(s["value"], dtype=s["dtype"]).reshape(s["shape"]) for n, s in fixed.items()})

    row = {"model": name, "samples": samples, "rounds": rounds, "weights_mb": source.stat().st_size / 2**20,
           "load_before": _load()}
    ort = ort_runner(source)
    interp32, interp16 = interpreter_runner(fp32, artifact32, lowered32), interpreter_runner(fp16, artifact16, lowered16)
    row["interp_fp32_ms"] = per_sample_ms(interp32, inputs)
    row["interp_fp16_ms"] = per_sample_ms(interp16, inputs)
    row["fp16_over_fp32"] = row["interp_fp16_ms"] / row["interp_fp32_ms"]
    times: dict[str, list[float]] = {"ort": [], "fp32": [], "fp16": []}
    for _ in range(rounds):  # interleaved: a slow spell of a shared machine hits each side alike
        times["ort"].append(per_sample_ms(ort, inputs))
        times["fp32"].append(stage_ms(interp32, inputs))
        times["fp16"].append(stage_ms(interp16, inputs))
    row["ort_ms"] = min(times["ort"])
    row["stage_fp32_ms"], row["stage_fp16_ms"] = min(times["fp32"]), min(times["fp16"])
    row["rounds_over_ort"] = [fp32 / ort for fp32, ort in zip(times["fp32"], times["ort"])]
    row["stage_over_ort"] = row["stage_fp32_ms"] / row["ort_ms"]
    row["stage_fp16_over_fp32"] = row["stage_fp16_ms"] / row["stage_fp32_ms"]
    if workers:
        with worker_runs({"fp32": interp32}, inputs) as timed:
            row["workers_fp32_ms"] = min(timed("fp32") for _ in range(rounds))
            row["workers_start_ms"] = timed.start_ms
    row["interp_over_ort"] = row["interp_fp32_ms"] / row["ort_ms"]
    if loop:
        row["validate_loop_ms"] = validate_loop_ms(fp32, source, interp32, samples)
    row["load_after"] = _load()
    print(f"{name}: {json.dumps(row)}", file=sys.stderr)
    return row


def _load() -> float | None:
    """The machine's 1-minute load average (None where the platform has none): a ratio measured
    while other work competed for the cores says less than one of a quiet machine."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _cell(row: dict, key: str, width: int, digits: int = 1) -> str:
    return f"{row[key]:>{width}.{digits}f}" if key in row else f"{'':>{width}}"


def print_table(rows: list[dict]) -> None:
    print(f"{'':<18} {'':>8} {'one sample at a time':^37}   {'as the validate stage runs them':^37}   "
          f"{'workers at once':^23}")
    print(f"{'model':<18} {'ort':>8} {'fp32':>8} {'fp16':>8} {'fp32/ort':>9} {'fp16/fp32':>9}   "
          f"{'fp32':>8} {'fp16':>8} {'fp32/ort':>9} {'fp16/fp32':>9}   {'fp32':>8} {'start':>14} {'validate loop':>14}")
    print(f"{'':<18} {'ms':>8} {'ms':>8} {'ms':>8} {'':>9} {'':>9}   "
          f"{'ms':>8} {'ms':>8} {'(<= 3)':>9} {'(<= 2)':>9}   {'ms':>8} {'ms':>14} {'ms/sample':>14}")
    print("-" * 154)
    for row in rows:
        print(" ".join([f"{row['model']:<18}", _cell(row, "ort_ms", 8), _cell(row, "interp_fp32_ms", 8),
                        _cell(row, "interp_fp16_ms", 8), _cell(row, "interp_over_ort", 9, 2),
                        _cell(row, "fp16_over_fp32", 9, 2), "  " + _cell(row, "stage_fp32_ms", 8),
                        _cell(row, "stage_fp16_ms", 8), _cell(row, "stage_over_ort", 9, 2),
                        _cell(row, "stage_fp16_over_fp32", 9, 2), "  " + _cell(row, "workers_fp32_ms", 8),
                        _cell(row, "workers_start_ms", 14), _cell(row, "validate_loop_ms", 14)]))
    print(f"\nper-sample wall time over {rows[0]['samples'] if rows else 0} samples, one process; onnxruntime "
          f"on the source with {ORT_THREADS} threads, one sample at a time (median); the interpreter on "
          "edgebuild's fp32 and fp16 packages")
    print("one sample at a time: median, BLAS's default threads; as the validate stage runs them: total / samples "
          "(in the build's process first, workers only when the samples left pay for them)")
    rounds = rows[0].get("rounds", 1) if rows else 1
    print("targets (<= 3, <= 2) are read on the validate stage's columns, against onnxruntime's per-sample time "
          f"measured in the same run: the two take turns for {rounds} rounds and each keeps its best (the "
          "per-round ratios are in --json)")
    print("workers at once: worker processes started from the first sample (EDGEBUILD_VALIDATE_WORKERS=2), "
          "their steady state; start: their start, reading and planning the package")
    print("validate loop: the validate stage's whole sample loop on the fp32 package (reference, interpreter, "
          "metrics), per sample")
    loads = [row[key] for row in rows for key in ("load_before", "load_after") if row.get(key) is not None]
    if loads:
        print(f"load average (1 min) while measuring: {min(loads):.2f} .. {max(loads):.2f} on {os.cpu_count()} cores")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(RECIPES), help="recipe names in recipes/, comma-separated")
    parser.add_argument("--samples", type=int, default=8, help="samples timed per runner (after one warm-up)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved rounds of onnxruntime and the validate stage's runs; the best of each is kept")
    parser.add_argument("--no-loop", action="store_true", help="skip timing the validate stage's sample loop")
    parser.add_argument("--no-workers", action="store_true",
                        help="skip timing the interpreter in worker processes started at once")
    parser.add_argument("--cache-dir", default=str(Path(tempfile.gettempdir()) / "edgebuild-bench-validate"),
                        help="the store the packages are built into (kept between runs)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = parser.parse_args(argv)

    rows = [measure(name, args.samples, args.cache_dir, not args.no_loop, not args.no_workers, args.rounds)
            for name in args.models.split(",") if name]
    if args.json:
        print(json.dumps({"ort_threads": ORT_THREADS, "rows": rows}, indent=1))
    else:
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
