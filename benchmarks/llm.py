"""A billion-parameter decoder to Core ML: edgebuild's ONNX and PyTorch routes against coremltools,
in time and peak memory, in one run.

The model is benchmarks/llm_source.py's Llama (TinyLlama-1.1B's shape, random weights; ``--small``:
4 layers, hidden 512, for a CI smoke run in about a minute). Rows, each a fresh worker process:

- ``edgebuild onnx fp16`` / ``edgebuild onnx int4``: ``edgebuild run`` (resolve, import, optimise,
  lower, compress: the conversion and the package written; no validation) of a stateful ``generate:``
  recipe (``max_context`` 2048, ``query_lengths`` [1, 64], iOS18) on the ONNX decoder with its KV cache,
  at float16 and with 4-bit block-wise (block 32) linear weights;
- ``edgebuild pytorch fp16``: the same from ``config.json`` + ``model.safetensors`` (``kind:
  causal_lm``: the pytorch frontend's causal-LM export, then the ONNX route);
- ``coremltools guide fp16`` / ``int4``: ``ct.convert`` with ``StateType`` on a Llama block stack
  written as coremltools' stateful-model guide writes one (KV cache as registered buffers sliced in
  place, states of 2048 tokens, inputs ``input_ids`` and ``causal_mask`` with flexible lengths;
  timed: load, trace, convert, save), same shapes and weights
  (read from the safetensors file into a module built on the meta device, so the module holds them
  once), then ``ct.optimize.coreml.linear_quantize_weights`` per block for int4;
- ``coremltools LlamaForCausalLM``: ``ct.convert`` on the traced transformers model itself; its
  failure (coremltools 9.0 has no conversion for transformers 5.x's ``diff``) is the peer's result;
- ``I/O floor``: one read of the fp32 weights and one write of them as fp16, in 64 MB chunks.

Every row starts with its source files in the page cache (read once, untimed, before its process
starts), so no row pays a cold read the others do not.

Memory is ``(peak RSS - RSS after imports) / fp16 weight bytes`` (2 bytes per parameter): each worker
reports its resident set size once its libraries are loaded, and the middle process reads the worker's
peak from ``getrusage(RUSAGE_CHILDREN)``. Time is the work after the imports. Ratios: against the
coremltools guide row of the same precision (time, memory), and against the floor (time).

An edgebuild row also gives each stage's wall and CPU seconds (every thread's): on a loaded machine
the CPU seconds, and their ratio to the floor's (``cpu/floor``), move much less than the wall times.
``--profile DIR`` writes a cProfile of each edgebuild row's build to ``DIR/<row>.prof``, clocked in
CPU time (a helper thread's work is charged to the call waiting for it).

    python benchmarks/llm.py [--small | --size medium] [--json] [--rows edgebuild-onnx-fp16,...] [--cache-dir DIR]
                             [--profile DIR]

A full run needs about 17 GB of free disk: the two 4.4 GB sources, and one build at a time, whose
store holds the fp32 weights once (the optimise stage's weight file is a hard link to the import
stage's) and the package (the rows run one after another
and each row's scratch directory is removed).
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import llm_source  # noqa: E402  (the generator beside this file)

ROWS = ("edgebuild-onnx-fp16", "edgebuild-onnx-int4", "edgebuild-pytorch-fp16", "coremltools-guide-fp16",
        "coremltools-guide-int4", "coremltools-llama", "io-floor")
PEER_OF = {"edgebuild-onnx-fp16": "coremltools-guide-fp16", "edgebuild-pytorch-fp16": "coremltools-guide-fp16",
           "edgebuild-onnx-int4": "coremltools-guide-int4"}
SEQUENCE = 64  # the prefill chunk: generate.query_lengths [1, SEQUENCE]
MAX_CONTEXT = 2048  # the cache length, of the recipes' generate section and the guide module's states
BLOCK = 32
CHUNK = 64 << 20


# -- worker side ---------------------------------------------------------------------------------
def current_rss_mb() -> float | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


_STARTED: list[tuple[float, float]] = []


def imports_done() -> None:
    import gc

    gc.collect()
    print(json.dumps({"after_imports_mb": current_rss_mb()}), flush=True)
    _STARTED.append((time.perf_counter(), time.process_time()))


def work_done(**extra) -> None:
    """The work's wall time, and its CPU time (every thread's): on a shared machine the wall times
    of two rows depend on the load each met, their CPU times much less."""
    wall, cpu = _STARTED[-1]
    print(json.dumps({"work_seconds": time.perf_counter() - wall, "work_cpu_seconds": time.process_time() - cpu,
                      **extra}), flush=True)


class StagePeaks:
    """Resident set size sampled in a thread (every 20 ms) and attributed to the stage running, with
    its anonymous and file-backed parts at that stage's peak (``/proc/self/smaps_rollup``): the
    stage that holds the peak and whether it is heap or mapped weights. ``on_event`` is the
    executor's event hook."""

    def __init__(self) -> None:
        import threading

        self.current = "start"
        self.peaks: dict[str, dict] = {}
        self.cpu_seconds: dict[str, float] = {}  # per stage, every thread's (wall seconds depend on the load)
        self.cpu_started = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def on_event(self, _label: str, event: str, _result) -> None:
        stage, _, what = event.partition(":")
        if what == "start":
            self.current = stage
            self.cpu_started = time.process_time()
        elif what == "done":
            self.cpu_seconds[stage] = round(time.process_time() - self.cpu_started, 1)
            self._record(split=True)  # the stage's last state, then what follows is between stages
            self.current = f"after {stage}"

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self._record()

    def _record(self, split: bool = False) -> None:
        rss = current_rss_mb()
        best = self.peaks.get(self.current)
        if rss is None or (best is not None and rss <= best["rss_mb"]):
            return
        peak = {"rss_mb": round(rss)}
        # smaps_rollup walks every mapping (gigabytes of mapped weights): read it for a new peak
        # that is 64 MB above the last one split, not every 20 ms, or the sampler would take a
        # good share of a loaded CPU from the build it measures
        if split or best is None or rss > best.get("split_at", 0) + 64:
            peak.update(_rollup_mb(), split_at=round(rss))
        else:
            peak.update({k: best[k] for k in ("anonymous_mb", "file_mb", "split_at") if k in best})
        self.peaks[self.current] = peak

    def stop(self) -> dict[str, dict]:
        self._stop.set()
        self._thread.join()
        return {stage: {k: v for k, v in peak.items() if k != "split_at"} for stage, peak in self.peaks.items()}


def _rollup_mb() -> dict:
    """Anonymous and file-backed resident MB (Linux; empty elsewhere)."""
    found = {}
    try:
        with open("/proc/self/smaps_rollup") as rollup:
            for line in rollup:
                key, _, rest = line.partition(":")
                if key in ("Anonymous", "Rss"):
                    found[key] = int(rest.split()[0]) / 1024
    except OSError:
        return {}
    if "Rss" not in found:
        return {}
    anonymous = found.get("Anonymous", 0.0)
    return {"anonymous_mb": round(anonymous), "file_mb": round(found["Rss"] - anonymous)}


def package_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def _preload_edgebuild() -> None:
    """Load the code a build uses before the baseline is read (see benchmarks/convert.py)."""
    from convert import import_libraries

    import coremltools  # noqa: F401
    import onnxruntime  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import_libraries()
    for package in ("edgebuild_pytorch",):
        import importlib
        import pkgutil

        module = importlib.import_module(package)
        for info in pkgutil.walk_packages(module.__path__, package + "."):
            if ".tests" not in info.name:
                try:
                    importlib.import_module(info.name)
                except Exception:
                    pass


def recipe_text(source: dict, row: str) -> str:
    """The recipe a row builds (YAML is JSON): the stateful decoder a user ships, a ``generate:`` recipe
    (KV cache in model state, ``MAX_CONTEXT`` tokens, prefill ``SEQUENCE`` tokens a call or decode 1)."""
    if row.startswith("edgebuild-pytorch"):
        src = {"model": source["pytorch/model.safetensors"], "format": "pytorch",
               "options": {"kind": "causal_lm", "config": source["pytorch/config.json"]}}
    else:
        src = {"model": source["onnx/model.onnx"]}
    recipe = {"edgebuild": 1, "name": "llm_bench", "source": src,
              "target": {"backend": "coreml", "deployment_target": "iOS18", "precision": "float16"},
              "compute": {"policy": "cpu_and_ne", "fp16_guard": False},
              "generate": {"max_context": MAX_CONTEXT, "query_lengths": [1, SEQUENCE], "logits": "all"},
              # the benchmark drops the validate stage (time and memory are the conversion's)
              "validate": {"generation": {"prompts": [[1, 2, 3]], "new_tokens": 2}},
              "outputs": {"dir": "out"}, "variants": {"build": {}}}
    if row.endswith("int4"):
        recipe["compression"] = {"weights": {"mode": "linear", "dtype": "int4", "granularity": "per_block",
                                             "block_size": BLOCK}}
    return json.dumps(recipe, indent=1)


def work_edgebuild(row: str, source_json: str, scratch: str) -> None:
    _preload_edgebuild()
    from edgebuild.build.jobs import load_variants, plan_jobs
    from edgebuild.dag.executor import Executor
    from edgebuild.registry import get_registry
    from edgebuild.store.location import open_store

    source = json.loads(source_json)
    recipe = Path(scratch) / "recipe.yaml"
    recipe.write_text(recipe_text(source, row))
    registry = get_registry()
    store = open_store(str(Path(scratch) / "store"))
    [build] = plan_jobs(load_variants([str(recipe)], ["build"], registry), registry, store)
    imports_done()
    build.job.stages = [s for s in build.job.stages if s.name != "validate"]
    sampler = StagePeaks()
    profile = _profiler()
    try:
        # stage outputs in the row's scratch directory (removed after the row), not the system temp
        Executor(None, on_event=sampler.on_event, scratch=Path(scratch)).run([build.job])
    finally:
        if profile is not None:
            profile.disable()
            profile.dump_stats(str(Path(os.environ[PROFILE_ENV]) / f"{row}.prof"))
        print(json.dumps({"stage_peaks": sampler.stop()}), flush=True)
    if build.job.error is not None:
        raise SystemExit(f"edgebuild failed: {build.job.error}")
    last = build.job.results[build.job.stages[-1].name]
    artifacts = list(Path(last.path).rglob("*.mlpackage"))
    stages = {name: round(result.seconds, 1) for name, result in build.job.results.items()
              if getattr(result, "seconds", None) is not None}
    work_done(package_bytes=package_bytes(artifacts[0]) if artifacts else None, stages=stages,
              stage_cpu=sampler.cpu_seconds)


PROFILE_ENV = "EDGEBUILD_BENCH_LLM_PROFILE"  # set by --profile DIR for the worker processes


def _profiler():
    """A running cProfile of the build under ``--profile``: the stages run in the main thread, and
    its clock is the process's CPU time, so the work of a stage's helper threads is charged to the
    call that waits for them and a loaded machine's waiting is not charged at all."""
    if not os.environ.get(PROFILE_ENV):
        return None
    import cProfile

    profile = cProfile.Profile(time.process_time)
    profile.enable()
    return profile


def work_coremltools_guide(row: str, source_json: str, scratch: str) -> None:
    import coremltools as ct
    import numpy as np
    import torch

    from llm_guide import GuideLlama, load_guide

    source = json.loads(source_json)
    imports_done()
    model = load_guide(source["pytorch/config.json"], source["pytorch/model.safetensors"], MAX_CONTEXT)
    example = (torch.zeros((1, 2), dtype=torch.int32), torch.zeros((1, 1, 2, 5), dtype=torch.float32))
    with torch.no_grad():
        traced = torch.jit.trace(model.eval(), example)
    del model
    query = ct.RangeDim(lower_bound=1, upper_bound=MAX_CONTEXT, default=1)
    end = ct.RangeDim(lower_bound=1, upper_bound=MAX_CONTEXT, default=1)
    cache = GuideLlama.cache_shape(json.loads(Path(source["pytorch/config.json"]).read_text()), MAX_CONTEXT)
    mlmodel = ct.convert(
        traced,
        inputs=[ct.TensorType(shape=(1, query), dtype=np.int32, name="input_ids"),
                ct.TensorType(shape=(1, 1, query, end), dtype=np.float16, name="causal_mask")],
        outputs=[ct.TensorType(dtype=np.float16, name="logits")],
        states=[ct.StateType(wrapped_type=ct.TensorType(shape=cache, dtype=np.float16), name="key_cache"),
                ct.StateType(wrapped_type=ct.TensorType(shape=cache, dtype=np.float16), name="value_cache")],
        minimum_deployment_target=ct.target.iOS18,
        compute_precision=ct.precision.FLOAT16,
        skip_model_load=True,
    )
    del traced
    if row.endswith("int4"):
        config = ct.optimize.coreml.OptimizationConfig(global_config=ct.optimize.coreml.OpLinearQuantizerConfig(
            mode="linear_symmetric", dtype="int4", granularity="per_block", block_size=BLOCK))
        mlmodel = ct.optimize.coreml.linear_quantize_weights(mlmodel, config=config)
    out = Path(scratch) / "guide.mlpackage"
    mlmodel.save(str(out))
    work_done(package_bytes=package_bytes(out))


def work_coremltools_llama(_row: str, source_json: str, scratch: str) -> None:
    import coremltools as ct
    import numpy as np
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    source = json.loads(source_json)
    imports_done()
    directory = str(Path(source["pytorch/config.json"]).parent)
    config = LlamaConfig.from_pretrained(directory)
    config.use_cache = False
    model = LlamaForCausalLM.from_pretrained(directory, config=config).eval()

    class Logits(torch.nn.Module):  # what a user traces: input ids in, logits out
        def __init__(self, causal_lm):
            super().__init__()
            self.causal_lm = causal_lm

        def forward(self, input_ids):
            return self.causal_lm(input_ids=input_ids, use_cache=False).logits

    example = torch.zeros((1, SEQUENCE), dtype=torch.int64)
    with torch.no_grad():
        traced = torch.jit.trace(Logits(model).eval(), (example,), strict=False)
    del model
    mlmodel = ct.convert(traced, inputs=[ct.TensorType(shape=(1, SEQUENCE), dtype=np.int32, name="input_ids")],
                         minimum_deployment_target=ct.target.iOS18, skip_model_load=True)
    out = Path(scratch) / "llama.mlpackage"
    mlmodel.save(str(out))
    work_done(package_bytes=package_bytes(out))


def work_io_floor(_row: str, source_json: str, scratch: str) -> None:
    """One read of the fp32 weights, one write of them as fp16: what any converter must at least do."""
    import numpy as np

    source = json.loads(source_json)
    imports_done()
    out = Path(scratch) / "weights.fp16"
    with open(source["onnx/model.onnx.data"], "rb") as src, open(out, "wb") as dst:
        while chunk := src.read(CHUNK):
            dst.write(np.frombuffer(chunk, dtype=np.float32).astype(np.float16).tobytes())
        dst.flush()
        os.fsync(dst.fileno())
    work_done(package_bytes=out.stat().st_size)


WORKERS = {"edgebuild-onnx-fp16": work_edgebuild, "edgebuild-onnx-int4": work_edgebuild,
           "edgebuild-pytorch-fp16": work_edgebuild, "coremltools-guide-fp16": work_coremltools_guide,
           "coremltools-guide-int4": work_coremltools_guide, "coremltools-llama": work_coremltools_llama,
           "io-floor": work_io_floor}


# -- middle process ------------------------------------------------------------------------------
def measure(row: str, source_json: str, scratch: str) -> dict:
    """Run one worker; its time, peak RSS and RSS after imports (MB), package size, or its error."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--work", row, source_json, scratch],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # Linux: kilobytes
    reported: dict = {}
    for line in done.stdout.splitlines():
        if line.startswith(('{"after_imports_mb"', '{"work_seconds"', '{"stage_peaks"')):
            reported.update(json.loads(line))
    if done.returncode != 0:
        return {"error": _error_line(done.stderr), "process_seconds": seconds}
    return {"process_seconds": seconds, "peak_mb": peak_mb, **reported}


def _error_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    for line in reversed(lines):  # the exception, not a trailing warning
        if "Error" in line or "error" in line or "failed" in line:
            return line.strip()[:300]
    return (lines[-1] if lines else "failed")[:300]


def source_files(row: str, source: dict) -> list[str]:
    """The files a row reads its weights from: the ONNX export or the safetensors checkpoint."""
    layout = "onnx/" if row.startswith("edgebuild-onnx") or row == "io-floor" else "pytorch/"
    return [path for name, path in source.items() if name.startswith(layout)]


def warm_page_cache(paths: list[str]) -> None:
    """Read ``paths`` once, untimed, so every row starts with its source in the page cache: rows then
    compare conversions, not which one happened to pay a cold read of 4 GB."""
    for path in paths:
        with open(path, "rb", buffering=0) as file:
            while file.read(CHUNK):
                pass


def run_row(row: str, source: dict, scratch_root: Path) -> dict:
    warm_page_cache(source_files(row, source))
    scratch = Path(tempfile.mkdtemp(prefix=f"{row}.", dir=scratch_root))
    try:
        done = subprocess.run([sys.executable, __file__, "--measure", row, json.dumps(source), str(scratch)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            return {"error": _error_line(done.stderr)}
        return json.loads(done.stdout)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # the store and package of a 1.1B build are GBs


def with_ratios(results: dict[str, dict], weight_mb: float) -> list[dict]:
    """One JSON row per measurement: seconds, memory over the fp16 weights, package size, ratios."""
    floor = results.get("io-floor", {})
    rows = []
    for name, run in results.items():
        row = {"row": name, "seconds": run.get("work_seconds"), "cpu_seconds": run.get("work_cpu_seconds"),
               "cpu_vs_peer": None, "process_seconds": run.get("process_seconds"),
               "peak_mb": run.get("peak_mb"), "after_imports_mb": run.get("after_imports_mb"),
               "peak_delta_mb": None, "memory_ratio": None, "package_mb": None, "peer": PEER_OF.get(name),
               "time_vs_peer": None, "memory_vs_peer": None, "time_vs_floor": None, "error": run.get("error"),
               "cpu_vs_floor": None, "stages": run.get("stages"), "stage_cpu": run.get("stage_cpu"),
               "stage_peaks": _stage_ratios(run, weight_mb)}
        if run.get("peak_mb") is not None and run.get("after_imports_mb") is not None:
            row["peak_delta_mb"] = run["peak_mb"] - run["after_imports_mb"]
            row["memory_ratio"] = row["peak_delta_mb"] / weight_mb
        if run.get("package_bytes") is not None:
            row["package_mb"] = run["package_bytes"] / 2**20
        if row["seconds"] is not None and floor.get("work_seconds"):
            row["time_vs_floor"] = row["seconds"] / floor["work_seconds"]
        if row["cpu_seconds"] is not None and floor.get("work_cpu_seconds"):
            row["cpu_vs_floor"] = row["cpu_seconds"] / floor["work_cpu_seconds"]
        rows.append(row)
    by_name = {r["row"]: r for r in rows}
    for row in rows:
        peer = by_name.get(row["peer"] or "")
        if peer is None:
            continue
        if row["seconds"] is not None and peer["seconds"]:
            row["time_vs_peer"] = row["seconds"] / peer["seconds"]
        if row["cpu_seconds"] is not None and peer["cpu_seconds"]:
            row["cpu_vs_peer"] = row["cpu_seconds"] / peer["cpu_seconds"]
        if row["peak_delta_mb"] is not None and peer["peak_delta_mb"]:
            row["memory_vs_peer"] = row["peak_delta_mb"] / peer["peak_delta_mb"]
    return rows


def _stage_ratios(run: dict, weight_mb: float) -> dict | None:
    """An edgebuild row's per-stage peaks as (RSS - RSS after imports) / fp16 weight bytes, with the
    anonymous and file-backed MB at that peak."""
    peaks, base = run.get("stage_peaks"), run.get("after_imports_mb")
    if not peaks or base is None:
        return None
    return {stage: {**peak, "ratio": round((peak["rss_mb"] - base) / weight_mb, 2)} for stage, peak in peaks.items()}


def _cell(value, spec: str, width: int) -> str:
    return f"{value:>{width}{spec}}" if value is not None else f"{'-':>{width}}"


def print_table(rows: list[dict], weight_mb: float, parameters: int) -> None:
    print(f"{parameters / 1e9:.2f} B parameters, fp16 weights {weight_mb:.0f} MB")
    print(f"{'row':<24} {'work s':>8} {'cpu s':>7} {'peak-imp MB':>12} {'x fp16 w':>9} {'pkg MB':>8} {'t/peer':>7} "
          f"{'cpu/peer':>9} {'mem/peer':>9} {'t/floor':>8} {'cpu/floor':>9}")
    print("-" * 120)
    for r in rows:
        print(f"{r['row']:<24} {_cell(r['seconds'], '.1f', 8)} {_cell(r.get('cpu_seconds'), '.1f', 7)} "
              f"{_cell(r['peak_delta_mb'], '.0f', 12)} "
              f"{_cell(r['memory_ratio'], '.2f', 9)} {_cell(r['package_mb'], '.0f', 8)} "
              f"{_cell(r['time_vs_peer'], '.2f', 7)} {_cell(r.get('cpu_vs_peer'), '.2f', 9)} "
              f"{_cell(r['memory_vs_peer'], '.2f', 9)} {_cell(r['time_vs_floor'], '.2f', 8)} {_cell(r.get('cpu_vs_floor'), '.2f', 9)}")
    print("peer: the coremltools guide-style module at the same precision; x fp16 w: (peak RSS - RSS after "
          "imports) / fp16 weight bytes; t/floor: work time over one read + one fp16 write of the weights; cpu s: the "
          "work's CPU seconds, all its threads (less sensitive to the machine's load than the wall time)")
    for r in rows:
        if r["stages"]:
            cpu = r["stage_cpu"] or {}
            print(f"{r['row']} per stage (wall s / cpu s): " + ", ".join(
                f"{stage} {seconds:.1f} / {cpu.get(stage, '-')}" for stage, seconds in r["stages"].items()))
    for r in rows:
        if r["stage_peaks"]:
            print(f"{r['row']} per stage (x fp16 w, anonymous / file MB at the peak): " + ", ".join(
                f"{stage} {p['ratio']:.2f} ({p.get('anonymous_mb', '-')} / {p.get('file_mb', '-')})"
                for stage, p in r["stage_peaks"].items()))
    for r in rows:
        if r["error"]:
            print(f"{r['row']}: failed: {r['error']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="a 4-layer, hidden-512 model (CI smoke run)")
    parser.add_argument("--size", choices=sorted(llm_source.SHAPES), default="full",
                        help="full: TinyLlama-1.1B's shape; medium: its widths with 6 layers; small: as --small")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated subset of {', '.join(ROWS)}")
    parser.add_argument("--cache-dir", default=str(Path(tempfile.gettempdir()) / "edgebuild-bench-llm"),
                        help="where the generated models are kept between runs")
    parser.add_argument("--scratch-dir", default=None, help="where builds write (default: beside the cache)")
    parser.add_argument("--profile", default=None, metavar="DIR",
                        help="write a cProfile of each edgebuild row's build to DIR/<row>.prof (slows it)")
    args = parser.parse_args(argv)
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        os.environ[PROFILE_ENV] = str(Path(args.profile).resolve())
    size = "small" if args.small else args.size
    wanted = [r for r in args.rows.split(",") if r]
    unknown = [r for r in wanted if r not in ROWS]
    if unknown:
        parser.error(f"unknown rows {unknown}; choose from {', '.join(ROWS)}")
    source = llm_source.generate(Path(args.cache_dir) / f"llama-{size}", size)
    weight_mb = source["parameters"] * 2 / 2**20
    scratch_root = Path(args.scratch_dir or Path(args.cache_dir) / "scratch")
    scratch_root.mkdir(parents=True, exist_ok=True)
    results = {}
    for row in wanted:
        results[row] = run_row(row, source, scratch_root)
        print(f"{row}: {results[row]}", file=sys.stderr, flush=True)
    rows = with_ratios(results, weight_mb)
    if args.json:
        print(json.dumps({"size": size, "parameters": source["parameters"], "fp16_weight_mb": weight_mb,
                          "rows": rows}, indent=1))
    else:
        print_table(rows, weight_mb, source["parameters"])
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--work":
        WORKERS[sys.argv[2]](*sys.argv[2:])
    elif len(sys.argv) == 5 and sys.argv[1] == "--measure":
        print(json.dumps(measure(*sys.argv[2:])))
    else:
        sys.exit(main())
