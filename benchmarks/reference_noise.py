"""How noisy is the fp32 reference? onnxruntime fp32 and our fp32 artifact against float64.

Validation compares an artifact with onnxruntime's fp32 result on the source model. That
reference is itself rounded: where an output is small and comes out of long sums or
cancellation (LayerNorm outputs, box offsets, LSTM state), two correct fp32 evaluations can
differ by more than a tight target such as ``max_rel <= 1e-4``. This script measures how big
that noise is, so a per-output limit in a recipe can be judged against it.

For each recipe (its ``fp32`` variant) and each of N validation samples (generated exactly as
the validate stage does, from the recipe's ``validate.inputs``):

- truth: the source ONNX graph converted to float64 and run by onnxruntime where it has double
  kernels for every op, else by onnx's reference evaluator (``edgebuild.verify.float64``, what
  ``validate.reference: float64`` uses);
- ORT: onnxruntime fp32 on the source (the validation reference);
- ours: the fp32 ``.mlpackage`` built by edgebuild, run in the MIL interpreter.

Per output it prints ``max_rel`` (the metric of ``edgebuild.verify.metrics``: max |d| /
max(|ref|, 1e-3)) and the cosine of ORT vs truth, ours vs truth and ours vs ORT, the ratio
(ours vs truth) / (ORT vs truth) (about 1 or below: the conversion is as close to the exact
answer as onnxruntime is), whether ours vs ORT meets 1e-4, and the recipe's fp32 limit.

    python benchmarks/reference_noise.py [--models minilm_paraphrase,silero_vad] [--samples 4]
                                         [--cache-dir D] [--json]

Builds go through the normal content-addressed store (``--cache-dir``, default edgebuild's
cache), so models built before are not rebuilt. The float64 evaluation of a big conv net in
the reference evaluator (ddddocr_det at 416x416) takes minutes per sample: use ``--samples``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import onnx

from edgebuild.verify.float64 import as_float64_feed, float64_runner, to_float64

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ("orientation", "ppocr_cls", "minilm_paraphrase", "minilm_int8", "silero_vad", "ddddocr_det")
TARGET_MAX_REL = 1e-4

Runner = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]

# -- building and running one recipe -------------------------------------------------------------
@dataclass
class BuiltModel:
    name: str
    source: Path  # the resolved source ONNX file
    reference: Runner  # onnxruntime fp32 on the source, as validation runs it
    candidate: Runner  # the fp32 .mlpackage in the MIL interpreter
    samples: list[dict[str, np.ndarray]]  # validation inputs the candidate takes
    fixed: dict[str, np.ndarray]  # inputs the recipe fixes (folded into the artifact)
    limits: Callable[[str], float | None]  # the recipe's fp32 max_rel limit for an output


def build_fp32(recipe_name: str, cache_dir: str | None, samples: int) -> BuiltModel:
    """Build (or fetch from the store) the recipe's fp32 variant; validation's inputs and runners."""
    from edgebuild.build.jobs import load_variants, plan_jobs
    from edgebuild.store.location import open_store
    from edgebuild.dag.executor import Executor
    from edgebuild.dag.validate import reference_for
    from edgebuild.errors import BuildError
    from edgebuild.registry import get_registry
    from edgebuild.verify.inputs import generate_inputs
    from edgebuild.verify.thresholds import limits_for

    registry = get_registry()
    store = open_store(cache_dir)
    [variant] = load_variants([str(ROOT / "recipes" / f"{recipe_name}.yaml")], ["fp32"], registry)
    [build] = plan_jobs([variant], registry, store)
    build.job.stages = [s for s in build.job.stages if s.name != "validate"]  # we compare ourselves
    Executor(store).run([build.job])
    if build.job.error is not None:
        raise BuildError(f"{recipe_name}: the fp32 build failed: {build.job.error}")
    results = build.job.results
    if "lower" not in results or not build.artifact.endswith(".mlpackage"):
        raise BuildError(f"{recipe_name}: expected a Core ML fp32 artifact, got {build.artifact!r}")

    from edgebuild_coreml.backend import CoreMLBackend

    reference, specs, _ = reference_for(registry, variant, results["resolve"].path)
    section = variant.recipe.validate_
    fixed = {n: np.asarray(s["value"], dtype=s["dtype"]).reshape(s["shape"]) for n, s in specs.items() if "value" in s}
    free = {n: s for n, s in specs.items() if "value" not in s}
    # the same seeds and order as validation: these are its first `samples` samples
    inputs = generate_inputs(section.model_copy(update={"samples": samples}), free, variant.base_dir)
    candidate = CoreMLBackend().runner(results["package"].path / build.artifact, "float32",
                                       lowered=results["lower"].info)
    return BuiltModel(
        name=recipe_name, source=results["resolve"].path, reference=reference, candidate=candidate,
        samples=inputs, fixed=fixed,
        limits=lambda output: limits_for(section.thresholds, section.per_output, output).get("max_rel_max"),
    )


def measure(model: BuiltModel, progress=lambda text: None) -> list[dict]:
    """One row per output: worst max_rel and cosine over the samples of the three comparisons."""
    from edgebuild.verify.metrics import compare_output

    start, why = time.perf_counter(), ""
    try:
        truth_runner, evaluator = float64_runner(to_float64(onnx.load(str(model.source))))
    except Exception as error:  # say so in the table rather than fake a truth
        truth_runner, evaluator, why = None, "none", f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
    pairs = {"ort_vs_f64": ("truth", "ort"), "ours_vs_f64": ("truth", "ours"), "ours_vs_ort": ("ort", "ours")}
    worst: dict[str, dict[str, dict[str, float]]] = {}
    for index, sample in enumerate(model.samples):
        feed = {**sample, **model.fixed}
        outputs = {"ort": model.reference(feed), "ours": model.candidate(sample)}
        if truth_runner is not None:
            try:
                outputs["truth"] = truth_runner(as_float64_feed(feed))
            except Exception as error:
                truth_runner, evaluator = None, "none"
                why = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
        for output, ort_value in outputs["ort"].items():
            if not np.issubdtype(np.asarray(ort_value).dtype, np.floating):
                continue
            row = worst.setdefault(output, {})
            for pair, (ref_side, cand_side) in pairs.items():
                if ref_side not in outputs or cand_side not in outputs:
                    continue
                metrics = compare_output(output, outputs[ref_side][output], outputs[cand_side][output])
                best = row.setdefault(pair, {"max_rel": 0.0, "cosine": 1.0})
                best["max_rel"] = max(best["max_rel"], metrics["max_rel"])
                best["cosine"] = min(best["cosine"], metrics["cosine"])
        progress(f"{model.name}: sample {index + 1}/{len(model.samples)} "
                 f"({time.perf_counter() - start:.0f} s, float64 by {evaluator})")
    rows = []
    for output, row in worst.items():
        rows.append({
            "model": model.name, "output": output, "samples": len(model.samples), "float64_by": evaluator,
            **({"float64_error": why} if truth_runner is None else {}),
            **row, "limit": model.limits(output),
        })
    return rows


# -- the table -------------------------------------------------------------------------------------
def _pair_cells(row: dict, pair: str) -> str:
    if pair not in row:
        return f"{'n/a':>9} {'':>10}"
    return f"{row[pair]['max_rel']:>9.2e} {1.0 - row[pair]['cosine']:>10.1e}"


def print_table(rows: list[dict]) -> None:
    print(f"{'model':<18} {'output':<17} {'ORT vs float64':>20}  {'ours vs float64':>20}  "
          f"{'ours vs ORT':>20}  {'ratio':>6} {'<=1e-4':>6} {'limit':>7}")
    print(f"{'':<18} {'':<17} " + "  ".join(f"{'max_rel':>9} {'1-cosine':>10}" for _ in range(3)))
    print("-" * 119)
    for row in rows:
        both = "ort_vs_f64" in row and "ours_vs_f64" in row and row["ort_vs_f64"]["max_rel"] > 0
        ratio = f"{row['ours_vs_f64']['max_rel'] / row['ort_vs_f64']['max_rel']:>6.2f}" if both else f"{'':>6}"
        meets = "yes" if row["ours_vs_ort"]["max_rel"] <= TARGET_MAX_REL else "no"
        limit = f"{row['limit']:>7.0e}" if row.get("limit") is not None else f"{'-':>7}"
        print(f"{row['model']:<18} {row['output'][:17]:<17} {_pair_cells(row, 'ort_vs_f64')}  "
              f"{_pair_cells(row, 'ours_vs_f64')}  {_pair_cells(row, 'ours_vs_ort')}  {ratio} {meets:>6} {limit}")
    print("\nmax_rel: max |d| / max(|ref|, 1e-3); max_rel and 1-cosine are the worst over the samples.")
    print("ratio: (ours vs float64) / (ORT vs float64); limit: the recipe's fp32 max_rel_max for the output.")
    notes = {}
    for row in rows:
        note = f"{row['samples']} samples, float64 by {row['float64_by']}"
        if "float64_error" in row:
            note += f": no float64 evaluation: {row['float64_error']}"
        notes.setdefault(row["model"], note)
    for model, note in notes.items():
        print(f"{model}: {note}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(RECIPES), help="recipe names in recipes/, comma-separated")
    parser.add_argument("--samples", type=int, default=4, help="validation samples per model (its first N)")
    parser.add_argument("--cache-dir", default=None, help="edgebuild store to build in (default: edgebuild's cache)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = parser.parse_args(argv)

    rows = []
    for name in [m for m in args.models.split(",") if m]:
        started = time.perf_counter()
        try:
            model = build_fp32(name, args.cache_dir, args.samples)
        except Exception as error:
            print(f"{name}: cannot build the fp32 variant: {error}", file=sys.stderr)
            continue
        print(f"{name}: built in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        rows.extend(measure(model, progress=lambda text: print(text, file=sys.stderr)))
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
