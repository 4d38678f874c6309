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
A third edgebuild worker runs the import stage alone (no Core ML code loaded), whose footprint is
the import's peak over the weights. Times are shown twice: the process's wall time from start to
exit, and the work after the imports. edgebuild's process time comes from a fourth worker that
runs the same stages as ``edgebuild run`` does, importing only what they import (the measuring
worker preloads every module, which a real run never does); its work time and memory come from
the preloading one.

    python benchmarks/convert.py [--models ddddocr_det,minilm_paraphrase] [--variants fp32,fp16]

Models one tool cannot convert are listed with the reason; ratios cover the models both convert.
``--json`` prints the rows (seconds, work_seconds, peak_mb, after_imports_mb per tool) instead.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
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


_WORK_STARTED: list[float] = []


def report_imports_done() -> None:
    """Tell the middle process the RSS at which the imports ended and the work starts."""
    import gc

    gc.collect()
    print(json.dumps({"after_imports_mb": current_rss_mb()}), flush=True)
    _WORK_STARTED.append(time.perf_counter())


def report_work_done() -> None:
    """Tell the middle process how long the work took after the imports (library import excluded)."""
    print(json.dumps({"work_seconds": time.perf_counter() - _WORK_STARTED[-1]}), flush=True)


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
    import edgebuild_coreml  # noqa: F401  (first, so coremltools is imported as a run imports it: lean)
    import coremltools  # noqa: F401
    import onnxruntime  # noqa: F401

    import_libraries()

    import edgebuild_coreml.backend  # noqa: F401
    from edgebuild.registry import get_registry

    get_registry()
    report_imports_done()


def work_edgebuild(recipe: str, variant: str, _source: str, cache: str) -> None:
    import edgebuild_coreml  # noqa: F401  (first, so coremltools is imported as a run imports it: lean)
    import coremltools  # noqa: F401
    import onnxruntime  # noqa: F401

    import edgebuild_coreml.backend  # noqa: F401
    import edgebuild_coreml.fp16_guard  # noqa: F401
    import edgebuild_coreml.interpreter  # noqa: F401
    import edgebuild_coreml.lowering.package  # noqa: F401
    import edgebuild.graph.optimize  # noqa: F401
    from edgebuild.build.jobs import load_variants, plan_jobs
    from edgebuild.store.location import open_store
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
    report_work_done()


def work_edgebuild_run(recipe: str, variant: str, _source: str, cache: str) -> None:
    """The stages as ``edgebuild run --no-cache`` runs them (validate left out), with no preloading:
    its wall time is what a user waits for, library imports included (and the interpreter's exit,
    which the ``edgebuild`` command shortens as it starts)."""
    from edgebuild.__main__ import skip_collections_at_exit

    skip_collections_at_exit()
    from edgebuild.build.jobs import load_variants, plan_jobs
    from edgebuild.dag.executor import Executor
    from edgebuild.registry import get_registry
    from edgebuild.store.location import open_store

    registry = get_registry()
    [build] = plan_jobs(load_variants([str(recipe)], [variant], registry), registry, open_store(cache))
    build.job.stages = [s for s in build.job.stages if s.name != "validate"]
    Executor(None).run([build.job])
    if build.job.error is not None:
        raise SystemExit(f"edgebuild failed: {build.job.error}")


def work_edgebuild_import(recipe: str, variant: str, _source: str, cache: str) -> None:
    """Only edgebuild's import stage (source file -> IR -> model.onnx + model.onnx.data), for its
    memory: no Core ML code is loaded, as in any process that does not lower."""
    import edgebuild.graph.frontend  # noqa: F401
    from edgebuild.build.jobs import load_variants, plan_jobs
    from edgebuild.store.location import open_store
    from edgebuild.dag.executor import Executor
    from edgebuild.registry import get_registry

    registry = get_registry()
    store = open_store(cache)
    [build] = plan_jobs(load_variants([str(recipe)], [variant], registry), registry, store)
    report_imports_done()
    build.job.stages = [s for s in build.job.stages if s.name in ("resolve", "import")]
    Executor(None).run([build.job])
    if build.job.error is not None:
        raise SystemExit(f"edgebuild failed: {build.job.error}")
    report_work_done()


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
    report_work_done()


WORKERS = {"baseline": work_baseline, "edgebuild": work_edgebuild, "edgebuild-run": work_edgebuild_run,
           "edgebuild-import": work_edgebuild_import, "onnxsim": work_onnxsim}


def _recipe_inputs(recipe: str) -> dict:
    from edgebuild.recipe import load_recipe

    variant = load_recipe(recipe, only=["fp32"])[0]
    return variant.recipe.model_dump(mode="json")["source"]["inputs"]


# -- measuring ---------------------------------------------------------------------------------
def measure(tool: str, recipe: str, variant: str, source: str, cache: str) -> dict:
    """Middle process: run one worker, report its wall time, peak RSS and RSS after imports (MB)."""
    # the worker's temporaries (a --no-cache build's stage outputs), removed once it is timed
    os.makedirs(cache, exist_ok=True)  # the baseline runs before anything made it
    scratch = tempfile.mkdtemp(prefix="scratch-", dir=cache)
    try:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, "--work", tool, recipe, variant, source, cache],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "TMPDIR": scratch})
        seconds = time.perf_counter() - start
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak_mb = usage.ru_maxrss / 1024  # Linux: kilobytes
    cpu_seconds = usage.ru_utime + usage.ru_stime  # steadier than wall time on a shared machine
    if done.returncode != 0:
        return {"error": _last_line(done.stderr)}
    reported = {}
    for line in done.stdout.splitlines():
        if line.startswith(('{"after_imports_mb"', '{"work_seconds"')):
            reported.update(json.loads(line))
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "peak_mb": peak_mb,
            "after_imports_mb": reported.get("after_imports_mb"),
            "work_seconds": reported.get("work_seconds")}


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
    from edgebuild.build.jobs import load_variants, source_resolver
    from edgebuild.store.location import open_store
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
    work = [r["work_seconds"] for r in ok if r.get("work_seconds") is not None]
    cpu = [r["cpu_seconds"] for r in ok if r.get("cpu_seconds") is not None]
    return {"seconds": fastest["seconds"], "work_seconds": min(work) if work else None,
            "cpu_seconds": min(cpu) if cpu else None,
            "peak_mb": smallest["peak_mb"], "after_imports_mb": smallest.get("after_imports_mb")}


def footprint_ratio(run: dict, weights_mb: float, baseline_mb: float) -> float | None:
    """(peak RSS - RSS after imports) / weight bytes; the baseline's peak stands in if unknown."""
    if "peak_mb" not in run:
        return None
    start = run.get("after_imports_mb") or baseline_mb
    return (run["peak_mb"] - start) / weights_mb


def _ratio(a: dict, b: dict, key: str = "seconds") -> str:
    if a.get(key) is None or b.get(key) is None:
        return f"{'':>6}"
    return f"{a[key] / b[key]:>6.2f}"


def _seconds(run: dict, key: str = "seconds", width: int = 7) -> str:
    if run.get(key) is not None:
        return f"{run[key]:>{width}.1f}"
    return f"{'failed' if 'error' in run and 'installed' not in run['error'] else 'n/a':>{width}}"


def print_table(rows: list[dict], baseline_mb: float) -> None:
    print(f"{'':<18} {'':>7}  {'process wall time, s':^23} {'eb / onnxsim':^13}  {'work, s':^15} {'work':>6}"
          f"   {'(peak - after imports) / weights':^39}   {'process CPU, eb / onnxsim':^13}")
    print(f"{'model':<18} {'MB':>7}  {'eb fp32':>7} {'eb fp16':>7} {'onnxsim':>7} {'fp32':>6} {'fp16':>6}  "
          f"{'eb fp32':>7} {'onnxsim':>7} {'ratio':>6}   {'eb fp32':>9} {'eb fp16':>9} {'eb import':>9} "
          f"{'onnxsim':>9}   {'fp32':>6} {'fp16':>6}")
    print("-" * 166)
    for row in rows:
        eb, f16, sim = row["edgebuild"], row.get("edgebuild fp16", {}), row["onnxsim"]
        # process times from the workers that import only what a run imports
        run, run16 = row.get("edgebuild run", eb), row.get("edgebuild run fp16", f16)
        cells = [f"{row['model']:<18}", f"{row['weights_mb']:>7.1f} ", _seconds(run), _seconds(run16), _seconds(sim),
                 _ratio(run, sim), _ratio(run16, sim), " ", _seconds(eb, "work_seconds"),
                 _seconds(sim, "work_seconds"), _ratio(eb, sim, "work_seconds"), "  "]
        for measured in (eb, f16, row.get("edgebuild import", {}), sim):
            ratio = footprint_ratio(measured, row["weights_mb"], baseline_mb)
            cells.append(f"{ratio:>9.2f}" if ratio is not None else f"{'':>9}")
        cells += ["  ", _ratio(run, sim, "cpu_seconds"), _ratio(run16, sim, "cpu_seconds")]
        print(" ".join(cells))
    print(f"\nimport baseline (coremltools + onnxruntime + edgebuild, no work): {baseline_mb:.0f} MB peak RSS")
    print("ratios are edgebuild / onnxsim (below 1: edgebuild is faster); fp16 compares edgebuild's fp16 variant "
          "(fp16 guard included) with onnxsim's fp32 conversion")
    print("process wall time: a fresh process from start to exit, library imports included (edgebuild's: a worker "
          "importing only what `edgebuild run` imports); work: from the end of the imports to the end (edgebuild's "
          "worker preloads every module first, for the memory baseline); process CPU: user + system seconds "
          "of the same processes as the wall time, less sensitive to other load on the machine")
    print("footprint: (peak RSS - the worker's RSS once its imports are done) / weight bytes; eb import is "
          "edgebuild's import stage alone (source file -> model.onnx + external data)")
    for row in rows:
        for tool in (*TOOLS, "edgebuild fp16", "edgebuild import", "edgebuild run", "edgebuild run fp16"):
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
        row["edgebuild import"] = best([run_measurement("edgebuild-import", recipe, str(source), args.cache_dir)
                                        for _ in range(args.repeat)])
        print(f"{name} edgebuild import: {row['edgebuild import']}", file=sys.stderr)
        for variant in [v for v in args.variants.split(",") if v]:
            for worker in ("edgebuild", "edgebuild-run"):
                if (worker, variant) == ("edgebuild", "fp32"):
                    continue  # measured above
                key = worker.replace("-", " ") + ("" if variant == "fp32" else f" {variant}")
                row[key] = best([run_measurement(worker, recipe, str(source), args.cache_dir, variant)
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
