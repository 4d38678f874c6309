"""Palettisation end to end: coremltools' k-means against edgebuild's, measured in one run.

Each side reads an .mlpackage from disk, palettises every weight and writes a new package:

* coremltools: ``MLModel(src)`` -> ``palettize_weights(mode="kmeans")`` -> ``save(dst)``;
* edgebuild: ``compress_mlpackage(src, dst, validate_compression({"weights": ...}))`` (algorithm ``kmeans``).

The table shows wall time, total weight error (sum over palettised weights of
||W - W_hat||^2 / n, read back from the written packages) and the ratios ours / coremltools'.
It also times the floor both share: reading the program and writing it back unchanged.

    python benchmarks/palettize.py [--model minilm.mlpackage ...] [--quick] [--skip-slow-baseline]

The synthetic model (24 linears of 2048x2048 in float16, about 100M parameters; 4 of 512x512
with --quick) is cached in the temp directory. coremltools' grouped run on it takes about a
quarter of an hour: ``--skip-slow-baseline`` reuses a coremltools measurement of more than
``SLOW_SECONDS`` from an earlier run of this script on the same machine (same model file,
config and coremltools version), and says so in the table.
"""

from __future__ import annotations

import os

os.environ.setdefault("TQDM_DISABLE", "1")  # coremltools' progress bars; read at import

import argparse
import datetime
import hashlib
import json
import logging
import platform
import shutil
import tempfile
import time
from pathlib import Path

import coremltools as ct
import coremltools.optimize.coreml as cto
import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.compress.apply import compress_mlpackage
from edgebuild_coreml.compress.config import validate_compression
from edgebuild_coreml.compress.program import iter_ops, load_program
from edgebuild_coreml.compress.serialize import save_program

CONFIGS = {
    "4-bit per-tensor": {"mode": "palettize", "nbits": 4},
    "4-bit grouped/16": {
        "mode": "palettize",
        "nbits": 4,
        "granularity": "per_grouped_channel",
        "group_size": 16,
    },
}
SLOW_SECONDS = 60.0
IOS18_SPEC = 9  # Core ML specification version of iOS18 / macOS15
WORK_DIR = Path(tempfile.gettempdir()) / "edgebuild-bench-palettize"
BASELINE_CACHE = WORK_DIR / "coremltools-baselines.json"


def synthetic_model(layers: int, width: int) -> Path:
    """A chain of ``layers`` linears of width x width with N(0, 1/width) weights (fp16)."""
    path = Path(tempfile.gettempdir()) / f"edgebuild-bench-linear{layers}x{width}.mlpackage"
    if path.exists():
        return path
    rng = np.random.default_rng(0)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, width))], opset_version=ct.target.iOS18)
    def program(x):
        for index in range(layers):
            weight = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
            x = mb.linear(x=x, weight=weight, name=f"fc{index}")
        return x

    model = ct.convert(
        program,
        convert_to="mlprogram",
        minimum_deployment_target=ct.target.iOS18,
        compute_precision=ct.precision.FLOAT16,
        skip_model_load=True,
    )
    staging = path.with_name(f"{path.stem}.{os.getpid()}.mlpackage")
    model.save(str(staging))
    os.replace(staging, path)
    return path


def deployment_target(path: Path) -> str:
    """The iOS release matching the package's specification version (for our gating)."""
    spec_version = ct.models.MLModel(str(path), skip_model_load=True).get_spec().specificationVersion
    return {7: "iOS16", 8: "iOS17", 9: "iOS18"}.get(spec_version, "iOS18")


def original_weights(path: Path) -> dict[str, np.ndarray]:
    program = load_program(ct.models.MLModel(str(path), skip_model_load=True))
    return {
        op.name: op.outputs[0].val.astype(np.float64)
        for op in iter_ops(program)
        if op.op_type == "const" and isinstance(op.outputs[0].val, np.ndarray) and op.outputs[0].val.size > 2048
    }


def weight_error(path: Path, originals: dict[str, np.ndarray]) -> tuple[float, int]:
    """Sum over palettised weights of the mean squared error, and how many there were."""
    total, seen = 0.0, 0
    for op in iter_ops(load_program(ct.models.MLModel(str(path), skip_model_load=True))):
        if op.op_type != "constexpr_lut_to_dense":
            continue
        original = originals[op.name.removesuffix("_palettized")]
        total += float(np.mean((op.outputs[0].op.materialized_val_inference() - original) ** 2))
        seen += 1
    if seen == 0:
        raise SystemExit(f"{path}: no weight was palettised; is it an ML program with weights?")
    return total, seen


def run_coremltools(src: Path, dst: Path, weights: dict) -> None:
    config = cto.OptimizationConfig(
        global_config=cto.OpPalettizerConfig(
            mode="kmeans",
            nbits=weights["nbits"],
            granularity=weights.get("granularity", "per_tensor"),
            group_size=weights.get("group_size", 32),
        )
    )
    model = ct.models.MLModel(str(src), skip_model_load=True)
    cto.palettize_weights(model, config).save(str(dst))


def run_ours(src: Path, dst: Path, weights: dict) -> None:
    compress_mlpackage(src, dst, validate_compression({"weights": weights}, target=deployment_target(src)))


def serialisation_floor(src: Path, dst: Path) -> float:
    """Seconds to read the program and write it back unchanged (both sides pay at least this)."""
    start = time.perf_counter()
    model = ct.models.MLModel(str(src), skip_model_load=True)
    save_program(load_program(model), model, dst)
    return time.perf_counter() - start


def _machine() -> str:
    machine_id = Path("/etc/machine-id")
    ident = machine_id.read_text().strip() if machine_id.exists() else ""
    return f"{platform.node()}|{ident}|{os.cpu_count()}"


def _baseline_key(src: Path, config_name: str) -> str:
    weights = src / "Data" / "com.apple.CoreML" / "weights" / "weight.bin"
    stat = weights.stat() if weights.exists() else src.stat()
    parts = [_machine(), str(src.resolve()), str(stat.st_size), str(stat.st_mtime_ns), config_name, ct.__version__]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


def _load_cache() -> dict:
    try:
        return json.loads(BASELINE_CACHE.read_text())
    except (OSError, ValueError):
        return {}


def _store_cache(cache: dict) -> None:
    BASELINE_CACHE.parent.mkdir(parents=True, exist_ok=True)
    staging = BASELINE_CACHE.with_suffix(f".{os.getpid()}.tmp")
    staging.write_text(json.dumps(cache, indent=1))
    os.replace(staging, BASELINE_CACHE)


def measure(src: Path, label: str, rows: list, skip_slow_baseline: bool) -> None:
    originals = original_weights(src)
    params = sum(w.size for w in originals.values())
    floor = serialisation_floor(src, WORK_DIR / "floor.mlpackage")
    print(f"  {label}: read + write unchanged {floor:.2f} s", flush=True)
    spec_version = ct.utils.load_spec(str(src)).specificationVersion
    for config_name, weights in CONFIGS.items():
        if weights.get("granularity") == "per_grouped_channel" and spec_version < IOS18_SPEC:
            print(f"  {label} {config_name}: skipped, the package targets an OS before iOS18 "
                  f"(spec {spec_version}), which has no grouped palettes", flush=True)
            continue
        results = {}
        cache = _load_cache()
        key = _baseline_key(src, config_name)
        cached = cache.get(key)
        for who, run in (("coremltools", run_coremltools), ("edgebuild", run_ours)):
            if who == "coremltools" and skip_slow_baseline and cached and cached["seconds"] > SLOW_SECONDS:
                results[who] = (cached["seconds"], cached["error"], f"cached {cached['measured']}")
                print(f"  {label} {config_name} {who}: {cached['seconds']:.1f} s "
                      f"(CACHED from an earlier run on this machine, {cached['measured']})", flush=True)
                continue
            dst = WORK_DIR / f"{who}.mlpackage"
            shutil.rmtree(dst, ignore_errors=True)
            start = time.perf_counter()
            run(src, dst, weights)
            seconds = time.perf_counter() - start
            error, count = weight_error(dst, originals)
            results[who] = (seconds, error, "measured")
            print(f"  {label} {config_name} {who}: {seconds:.2f} s, {count} weights", flush=True)
            if who == "coremltools":
                now = datetime.datetime.now().isoformat(timespec="seconds")
                cache[key] = {"seconds": seconds, "error": error, "measured": now}
                _store_cache(cache)
        rows.append((label, params, config_name, floor, results))


def print_table(rows: list) -> None:
    header = (f"{'model':<14}{'params':>8}  {'config':<18}{'floor s':>8}{'ct s':>9}{'ours s':>8}"
              f"{'speed-up':>9}{'ct MSE':>11}{'our MSE':>11}{'MSE ratio':>10}  baseline")
    print(header)
    print("-" * len(header))
    for label, params, config_name, floor, results in rows:
        ct_s, ct_err, how = results["coremltools"]
        our_s, our_err, _ = results["edgebuild"]
        print(
            f"{label:<14}{params / 1e6:>7.1f}M  {config_name:<18}{floor:>8.2f}{ct_s:>9.2f}{our_s:>8.2f}"
            f"{ct_s / our_s:>8.1f}x{ct_err:>11.4g}{our_err:>11.4g}{our_err / ct_err:>10.4f}  {how}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, action="append", default=[],
                        help="an .mlpackage to include (e.g. paraphrase-MiniLM-L3-v2); repeatable")
    parser.add_argument("--quick", action="store_true", help="a small synthetic model instead")
    parser.add_argument("--skip-slow-baseline", action="store_true",
                        help=f"reuse cached coremltools runs slower than {SLOW_SECONDS:.0f} s from this machine")
    args = parser.parse_args()
    logging.getLogger("coremltools").setLevel(logging.ERROR)
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    print(f"{os.cpu_count()} CPUs; load average before: {os.getloadavg()[0]:.1f}")

    rows: list = []
    for path in args.model:
        measure(path, path.stem[:14], rows, args.skip_slow_baseline)
    layers, width = (4, 512) if args.quick else (24, 2048)
    measure(synthetic_model(layers, width), f"linear{layers}x{width}", rows, args.skip_slow_baseline)
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    print()
    print_table(rows)


if __name__ == "__main__":
    main()
