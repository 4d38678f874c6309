"""Conversion time and peak memory: edgebuild against onnxsim's Core ML exporter.

For each recipe in ``recipes/`` naming one of the real ONNX models, both tools turn the same
source file into an fp32 ``.mlpackage`` (edgebuild also builds the recipe's fp16 variant, whose
fp16 overflow guard runs the program in the MIL interpreter just before the fp16 cast pass):

- edgebuild: its import, optimise, lower and package stages (``edgebuild run --no-cache``
  without the validate stage, which is not conversion);
- onnxsim 0.8.1: ``onnxsim.simplify`` with the recipe's input shapes (its exporter wants a
  simplified, static graph), ``onnxsim.coreml_export.convert_to_coreml``, then ``save``.

Every measurement runs in a fresh worker process, started by a fresh middle process that
reads the worker's peak resident set size from ``getrusage(RUSAGE_CHILDREN).ru_maxrss``
(numpy and coremltools allocate outside Python's heap, so tracemalloc would miss most of it).
A baseline worker that only imports both tools shows how much of a peak is import overhead.

The memory metric is the conversion's own footprint relative to the model:
``(peak RSS - RSS after imports) / weight bytes``, where each worker reads its own resident set
size once its imports are done (before any work), so library import cost is not counted.

    python benchmarks/convert.py [--models ddddocr_det,minilm_paraphrase] [--variants fp32,fp16]

Models one tool cannot convert are listed with the reason; ratios cover the models both convert.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ("orientation", "ppocr_cls", "ddddocr_det", "minilm_paraphrase", "minilm_int8", "silero_vad")
TOOLS = ("edgebuild", "onnxsim")


# -- workers (run in their own process) -------------------------------------------------------
def current_rss_mb() -> float | None:
    """This process's resident set size now (Linux /proc), in MB; None elsewhere."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def report_imports_done() -> None:
    """Tell the middle process the RSS at which the imports ended and the work starts."""
    import gc

    gc.collect()
    print(json.dumps({"after_imports_mb": current_rss_mb()}), flush=True)


def import_libraries() -> None:
    """Load the code a conversion uses, so that "after imports" means after all of it.

    edgebuild imports lowerings, fusion rules and interpreter ops on first use, and onnxscript
    and onnx load parts of themselves lazily too; without this, library code loaded mid-run
    would count as the model's footprint.
    """
    import importlib
    import pkgutil

    for package in ("edgebuild", "edgebuild_coreml", "onnxscript.rewriter", "onnxscript.optimizer", "onnx.reference"):
        module = importlib.import_module(package)
        for info in pkgutil.walk_packages(module.__path__, package + "."):
            if ".tests" in info.name or info.name.endswith(("__main__", ".conftest")):
                continue
            try:
                importlib.import_module(info.name)
            except Exception:  # a module for another platform or an optional dependency
                pass


def work_baseline(_recipe: str, _variant: str, _source: str, _cache: str) -> None:
    import coremltools  # noqa: F401
    import onnxruntime  # noqa: F401

    import_libraries()

    import edgebuild_coreml.backend  # noqa: F401
    from edgebuild.registry import get_registry

    get_registry()
    report_imports_done()


def work_edgebuild(recipe: str, variant: str, _source: str, cache: str) -> None:
    import coremltools  # noqa: F401
    import onnxruntime  # noqa: F401

    import edgebuild_coreml.backend  # noqa: F401
    import edgebuild_coreml.fp16_guard  # noqa: F401
    import edgebuild_coreml.interpreter  # noqa: F401
    import edgebuild_coreml.lowering.package  # noqa: F401
    import edgebuild.graph.optimize  # noqa: F401
    from edgebuild.build import load_variants, open_store, plan_jobs
    from edgebuild.dag.executor import Executor
    from edgebuild.registry import get_registry

    import_libraries()
    registry = get_registry()
    store = open_store(cache)  # only the resolve stage reads it: the download is not conversion
    [build] = plan_jobs(load_variants([str(recipe)], [variant], registry), registry, store)
    report_imports_done()
    build.job.stages = [s for s in build.job.stages if s.name != "validate"]
    Executor(None).run([build.job])
    if build.job.error is not None:
        raise SystemExit(f"edgebuild failed: {build.job.error}")


def work_onnxsim(recipe: str, _variant: str, source: str, _cache: str) -> None:
    import coremltools as ct
    import onnxsim
    from onnxsim.coreml_export import convert_to_coreml

    report_imports_done()

    shapes = {name: spec["shape"] for name, spec in _recipe_inputs(recipe).items() if spec.get("shape")}
    model, _ = onnxsim.simplify(source, overwrite_input_shapes=shapes)
    mlmodel = convert_to_coreml(model, minimum_deployment_target="iOS17", compute_precision=ct.precision.FLOAT32)
    with tempfile.TemporaryDirectory() as out:
        mlmodel.save(str(Path(out) / "model.mlpackage"))


WORKERS = {"baseline": work_baseline, "edgebuild": work_edgebuild, "onnxsim": work_onnxsim}


def _recipe_inputs(recipe: str) -> dict:
    from edgebuild.recipe import load_recipe

    variant = load_recipe(recipe, only=["fp32"])[0]
    return variant.recipe.model_dump(mode="json")["source"]["inputs"]


# -- measuring ---------------------------------------------------------------------------------
def measure(tool: str, recipe: str, variant: str, source: str, cache: str) -> dict:
    """Middle process: run one worker, report its wall time, peak RSS and RSS after imports (MB)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--work", tool, recipe, variant, source, cache],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # Linux: kilobytes
    if done.returncode != 0:
        return {"error": _last_line(done.stderr)}
    after_imports = next((json.loads(line)["after_imports_mb"] for line in done.stdout.splitlines()
                          if line.startswith('{"after_imports_mb"')), None)
    return {"seconds": seconds, "peak_mb": peak_mb, "after_imports_mb": after_imports}


def run_measurement(tool: str, recipe: str, source: str, cache: str, variant: str = "fp32") -> dict:
    done = subprocess.run([sys.executable, __file__, "--measure", tool, recipe, variant, source, cache],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": _last_line(done.stderr)}
    return json.loads(done.stdout)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "failed")[:160]


def resolve_source(recipe: str, cache: str) -> Path:
    """The recipe's source model, fetched (once) into the benchmark's cache."""
    from edgebuild.build import load_variants, open_store, source_resolver
    from edgebuild.registry import get_registry

    registry = get_registry()
    variant = load_variants([recipe], ["fp32"], registry)[0]
    return source_resolver(variant, registry, open_store(cache))().path


def onnxsim_installed() -> bool:
    try:
        from importlib.metadata import version

        return version("onnxsim") == "0.8.1"
    except Exception:
        return False


# -- the table ---------------------------------------------------------------------------------
def best(runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    fastest, smallest = min(ok, key=lambda r: r["seconds"]), min(ok, key=lambda r: r["peak_mb"])
    return {"seconds": fastest["seconds"], "peak_mb": smallest["peak_mb"],
            "after_imports_mb": smallest.get("after_imports_mb")}


def footprint_ratio(run: dict, weights_mb: float, baseline_mb: float) -> float | None:
    """(peak RSS - RSS after imports) / weight bytes; the baseline's peak stands in if unknown."""
    if "peak_mb" not in run:
        return None
    start = run.get("after_imports_mb") or baseline_mb
    return (run["peak_mb"] - start) / weights_mb


def print_table(rows: list[dict], baseline_mb: float) -> None:
    print(f"{'model':<18} {'weights':>8} {'edgebuild':>10} {'onnxsim':>9} {'time':>6}   "
          f"{'edgebuild':>10} {'onnxsim':>9} {'peak':>6}   {'(peak - after imports) / weights':>33}")
    print(f"{'':<18} {'MB':>8} {'s':>10} {'s':>9} {'ratio':>6}   {'peak MB':>10} {'peak MB':>9} "
          f"{'ratio':>6}   {'eb fp32':>9} {'eb fp16':>9} {'onnxsim':>13}")
    print("-" * 115)
    for row in rows:
        eb, sim = row["edgebuild"], row["onnxsim"]
        cells = [f"{row['model']:<18}", f"{row['weights_mb']:>8.1f}"]
        cells.append(f"{eb['seconds']:>10.1f}" if "seconds" in eb else f"{'failed':>10}")
        cells.append(f"{sim['seconds']:>9.1f}" if "seconds" in sim else f"{'n/a':>9}")
        both = "seconds" in eb and "seconds" in sim
        cells.append(f"{eb['seconds'] / sim['seconds']:>6.2f}" if both else f"{'':>6}")
        cells.append(f"  {eb['peak_mb']:>10.0f}" if "peak_mb" in eb else f"  {'':>10}")
        cells.append(f"{sim['peak_mb']:>9.0f}" if "peak_mb" in sim else f"{'':>9}")
        cells.append(f"{eb['peak_mb'] / sim['peak_mb']:>6.2f}" if both else f"{'':>6}")
        cells.append("  ")
        for run, width in ((eb, 9), (row.get("edgebuild fp16", {}), 9), (sim, 13)):
            ratio = footprint_ratio(run, row["weights_mb"], baseline_mb)
            cells.append(f"{ratio:>{width}.2f}" if ratio is not None else f"{'':>{width}}")
        print(" ".join(cells))
    print(f"\nimport baseline (coremltools + onnxruntime + edgebuild, no work): {baseline_mb:.0f} MB peak RSS")
    print("ratios are edgebuild / onnxsim (below 1: edgebuild is faster or smaller)")
    print("footprint: (peak RSS - the worker's RSS once its imports are done) / weight bytes; "
          "eb fp16 is the recipe's fp16 variant (fp16 guard included)")
    for row in rows:
        for tool in (*TOOLS, "edgebuild fp16"):
            if "error" in row.get(tool, {}):
                print(f"{row['model']}: {tool} could not convert it: {row[tool]['error']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(RECIPES), help="recipe names in recipes/, comma-separated")
    parser.add_argument("--repeat", type=int, default=1, help="runs per tool and model; the best is shown")
    parser.add_argument("--cache-dir", default=str(Path(tempfile.gettempdir()) / "edgebuild-bench-convert"),
                        help="where the source models are downloaded (kept between runs)")
    parser.add_argument("--variants", default="fp32,fp16",
                        help="edgebuild variants to build (onnxsim always converts at fp32)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = parser.parse_args(argv)

    tools = list(TOOLS)
    if not onnxsim_installed():
        print("onnxsim 0.8.1 is not installed (pip install onnxsim==0.8.1): measuring edgebuild only",
              file=sys.stderr)
        tools.remove("onnxsim")
    baseline = run_measurement("baseline", "-", "-", args.cache_dir)
    baseline_mb = baseline.get("peak_mb", 0.0)
    rows = []
    for name in args.models.split(","):
        recipe = str(ROOT / "recipes" / f"{name}.yaml")
        source = resolve_source(recipe, args.cache_dir)
        row = {"model": name, "weights_mb": source.stat().st_size / 2**20,
               "onnxsim": {"error": "onnxsim 0.8.1 is not installed"}}
        for tool in tools:
            row[tool] = best([run_measurement(tool, recipe, str(source), args.cache_dir) for _ in range(args.repeat)])
            print(f"{name} {tool}: {row[tool]}", file=sys.stderr)
        for variant in [v for v in args.variants.split(",") if v and v != "fp32"]:
            key = f"edgebuild {variant}"
            row[key] = best([run_measurement("edgebuild", recipe, str(source), args.cache_dir, variant)
                             for _ in range(args.repeat)])
            print(f"{name} {key}: {row[key]}", file=sys.stderr)
        rows.append(row)
    if args.json:
        print(json.dumps({"baseline_mb": baseline_mb, "rows": rows}, indent=1))
    else:
        print_table(rows, baseline_mb)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "--work":
        WORKERS[sys.argv[2]](*sys.argv[3:])
    elif len(sys.argv) == 7 and sys.argv[1] == "--measure":
        print(json.dumps(measure(*sys.argv[2:])))
    else:
        sys.exit(main())
