"""A 20-variant matrix (10 compression modes x 2 precisions of recipes/ppocr_cls.yaml's model)
built cold with the local executor on one thread (``-j 1``) and on a Dask LocalCluster of two
worker processes (one thread each), in one run.

Reports the speed-up (target: at least 1.7x with two free cores) and the scheduling overhead
per stage: the same matrix built again from a full store (outputs deleted, so every stage goes
through its store lookup), on the cluster minus locally, divided by the number of stage tasks.

    python benchmarks/matrix_dask.py [--json] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MODES = {
    "none": None,
    "int8_channel": {"weights": {"mode": "linear", "dtype": "int8", "granularity": "per_channel"}},
    "int8_tensor": {"weights": {"mode": "linear", "dtype": "int8", "granularity": "per_tensor"}},
    "uint8_asym": {"weights": {"mode": "linear", "dtype": "uint8", "symmetric": False}},
    "int4_block": {"weights": {"mode": "linear", "dtype": "int4", "granularity": "per_block", "block_size": 32}},
    "pal8": {"weights": {"mode": "palettize", "nbits": 8}},
    "pal4": {"weights": {"mode": "palettize", "nbits": 4}},
    "pal2": {"weights": {"mode": "palettize", "nbits": 2}},
    "pal4_grouped": {"weights": {"mode": "palettize", "nbits": 4, "granularity": "per_grouped_channel",
                                 "group_size": 16}},
    "prune50": {"weights": {"mode": "prune", "method": "magnitude", "target_sparsity": 0.5}},
}
PRECISIONS = {"fp32": "float32", "fp16": "float16"}


def matrix_recipe() -> dict:
    """ppocr_cls's source and validation inputs; every (mode, precision) pair a variant. Thresholds
    are left out: a compressed variant is measured, not judged."""
    base = yaml.safe_load((ROOT / "recipes" / "ppocr_cls.yaml").read_text())
    variants = {}
    for mode, compression in MODES.items():
        for short, precision in PRECISIONS.items():
            variants[f"{mode}_{short}"] = {"target": {"precision": precision},
                                           **({"compression": compression} if compression else {})}
    return {
        "edgebuild": 1, "name": "matrix", "source": base["source"],
        "target": {**base["target"], "deployment_target": "iOS18"},  # int4 and grouped palettes need iOS18
        "compute": base["compute"],
        "validate": {"samples": 8, "inputs": base["validate"]["inputs"]},
        "variants": variants,
        "outputs": {"dir": "out"},
    }


def edgebuild(workdir: Path, cache: Path, *args) -> tuple[float, dict]:
    env = {**os.environ, "EDGEBUILD_CACHE_DIR": str(cache)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "edgebuild", "run", "matrix.yaml", "--json", "-q", *args],
                          cwd=workdir, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 3):  # 3: a variant missed a threshold, still built
        sys.exit(f"build failed ({' '.join(args)}):\n{done.stderr}")
    return elapsed, json.loads(done.stdout)


def primed_store(workdir: Path, name: str) -> Path:
    """A store holding only the downloaded source: the download is not the build."""
    cache = workdir / name
    env = {**os.environ, "EDGEBUILD_CACHE_DIR": str(cache)}
    subprocess.run([sys.executable, "-m", "edgebuild", "plan", "matrix.yaml"], cwd=workdir, env=env,
                   capture_output=True)
    shutil.rmtree(cache / "objects", ignore_errors=True)
    return cache


def stage_tasks(report: dict) -> int:
    """Distinct stages the matrix runs (variants share some): the tasks on the cluster."""
    return len({s["key"] for v in report["variants"] for s in v["stages"]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the numbers as one JSON object")
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it")
    args = parser.parse_args()
    from distributed import LocalCluster

    workdir = args.keep or Path(tempfile.mkdtemp(prefix="edgebuild-matrix-"))
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "matrix.yaml").write_text(yaml.safe_dump(matrix_recipe(), sort_keys=False))
    local_store, cluster_store = primed_store(workdir, "store-local"), primed_store(workdir, "store-cluster")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as cluster:
        executor = "dask://" + cluster.scheduler_address.removeprefix("tcp://")
        local_cold, report = edgebuild(workdir, local_store, "-j", "1")
        cluster_cold, cluster_report = edgebuild(workdir, cluster_store, "--executor", executor)
        shutil.rmtree(workdir / "out")  # no up-to-date stamp: every stage goes through the store
        local_cached, _ = edgebuild(workdir, local_store, "-j", "1")
        shutil.rmtree(workdir / "out")
        cluster_cached, _ = edgebuild(workdir, cluster_store, "--executor", executor)
    tasks = stage_tasks(report)
    # keys agree until a stage's output carries Core ML's random package identifiers (uuid4 item
    # names, as in any two builds); the stages after it take that output's digest
    local_keys = {s["key"] for v in report["variants"] for s in v["stages"]}
    cluster_keys = {s["key"] for v in cluster_report["variants"] for s in v["stages"]}
    numbers = {
        "variants": len(report["variants"]),
        "stage_tasks": tasks,
        "stage_keys_shared_with_local": len(local_keys & cluster_keys),
        "local_j1_cold_s": round(local_cold, 2),
        "dask_2_workers_cold_s": round(cluster_cold, 2),
        "speedup": round(local_cold / cluster_cold, 2),
        "local_j1_cached_s": round(local_cached, 2),
        "dask_2_workers_cached_s": round(cluster_cached, 2),
        "overhead_per_stage_ms": round((cluster_cached - local_cached) / tasks * 1000, 1),
        "cpus": os.cpu_count(),
        "load_average_1min": round(os.getloadavg()[0], 2),
    }
    if args.json:
        print(json.dumps(numbers))
    else:
        for name, value in numbers.items():
            print(f"{name:<26} {value}")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
