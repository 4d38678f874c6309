"""A 20-variant matrix (10 compression modes x 2 precisions of recipes/ppocr_cls.yaml's model)
built cold with the local executor on one thread (``-j 1``) and on a Dask LocalCluster of two
worker processes (one thread each, started with the edgebuild.dag.dask_worker preload before
the timings, as a ``dask://`` cluster exists before a build), in one run.

Reports the speed-up (target: at least 1.7x with two free cores), what bounds it (each run's CPU
utilisation, user + system over wall time, whose ratio a busy machine caps the speed-up at; the
critical path; stage body seconds per stage; from the cluster's task stream each worker's busy
share, idle time and transfers, and which worker ran how many of each stage) and the scheduling
overhead per stage: the same matrix built again from a full store (outputs deleted, so every
stage goes through its store lookup), on the cluster minus locally, divided by the number of
stage tasks.

    python benchmarks/matrix_dask.py [--json] [--keep DIR] [--cold-workers]
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
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PRELOAD = "edgebuild.dag.dask_worker"  # what `dask worker --preload` loads: the plugins imported before any build
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


@dataclass
class Run:
    seconds: float  # wall time of `edgebuild run`
    cpu_seconds: float  # user + system time of the edgebuild process (and its children)
    report: dict  # its --json output


def edgebuild(workdir: Path, cache: Path, *args) -> Run:
    env = {**os.environ, "EDGEBUILD_CACHE_DIR": str(cache)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "edgebuild", "run", "matrix.yaml", "--json", "-q", *args],
                          cwd=workdir, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 3):  # 3: a variant missed a threshold, still built
        sys.exit(f"build failed ({' '.join(args)}):\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Run(elapsed, cpu, json.loads(done.stdout))


def workers_cpu_seconds(client) -> float:
    """user + system time the cluster's worker processes have used so far."""
    def used() -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        return own.ru_utime + own.ru_stime

    return sum(client.run(used).values())


def stage_seconds(report: dict) -> dict[str, float]:
    """Each distinct stage's (key's) body time, as the run that built it recorded it."""
    seconds: dict[str, float] = {}
    for variant in report["variants"]:
        for stage in variant["stages"]:
            seconds[stage["key"]] = max(seconds.get(stage["key"], 0.0), stage["seconds"] or 0.0)
    return seconds


def by_stage(report: dict) -> dict[str, float]:
    """Stage body seconds summed per stage name (each distinct stage once)."""
    names = {s["key"]: s["name"] for v in report["variants"] for s in v["stages"]}
    total: dict[str, float] = {}
    for key, seconds in stage_seconds(report).items():
        total[names[key]] = round(total.get(names[key], 0.0) + seconds, 2)
    return total


def critical_path(report: dict) -> float:
    """The longest variant chain of stage bodies: no number of workers builds the matrix faster."""
    seconds = stage_seconds(report)
    return max(sum(seconds[s["key"]] for s in v["stages"]) for v in report["variants"])


def task_stream(records: list[dict], workers: list[str]) -> dict:
    """Per worker: how long it computed, idled and fetched inputs; per stage: how many tasks ran
    on which worker (w0, w1, in the cluster's order)."""
    names = {address: f"w{i}" for i, address in enumerate(sorted(workers))}
    computes = [(r, ss) for r in records for ss in r["startstops"] if ss["action"] == "compute"]
    if not computes:
        return {}
    begin = min(ss["start"] for _, ss in computes)
    end = max(ss["stop"] for _, ss in computes)
    per_worker = {}
    for address, name in names.items():
        mine = sorted((ss["start"], ss["stop"]) for r, ss in computes if r["worker"] == address)
        transfers = [ss for r in records if r["worker"] == address for ss in r["startstops"]
                     if ss["action"] == "transfer"]
        busy = sum(stop - start for start, stop in mine)
        per_worker[name] = {
            "tasks": len(mine),
            "busy_s": round(busy, 2),
            "busy_share": round(busy / (end - begin), 2),
            "first_task_s": round(mine[0][1] - mine[0][0], 2) if mine else None,
            # idle: before its first task (the chain's shared head runs on one worker), between
            # tasks (waiting for inputs, or dispatch), after its last
            "idle_before_s": round(mine[0][0] - begin, 2) if mine else None,
            "idle_between_s": round(sum(b[0] - a[1] for a, b in zip(mine, mine[1:])), 2),
            "idle_after_s": round(end - mine[-1][1], 2) if mine else None,
            "transfers": len(transfers),
            "transfer_s": round(sum(ss["stop"] - ss["start"] for ss in transfers), 3),
        }
    placement: dict[str, dict[str, int]] = {}
    for r, _ in computes:
        stage = r["key"].split("-", 1)[0]
        on = placement.setdefault(stage, {name: 0 for name in names.values()})
        on[names.get(r["worker"], r["worker"])] += 1
    return {"span_s": round(end - begin, 2), "workers": per_worker, "placement": placement}


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
    parser.add_argument("--cold-workers", action="store_true",
                        help=f"start the workers without --preload {PRELOAD} (each imports the plugins in its first stage)")
    args = parser.parse_args()
    from distributed import Client, LocalCluster

    workdir = args.keep or Path(tempfile.mkdtemp(prefix="edgebuild-matrix-"))
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "matrix.yaml").write_text(yaml.safe_dump(matrix_recipe(), sort_keys=False))
    local_store, cluster_store = primed_store(workdir, "store-local"), primed_store(workdir, "store-cluster")
    preload = [] if args.cold_workers else [PRELOAD]
    # the cluster exists before the build, as a `dask://` executor's does; started outside the timings
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=":0",
                      preload=preload) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        workers = list(client.scheduler_info()["workers"])
        executor = "dask://" + cluster.scheduler_address.removeprefix("tcp://")
        local_cold = edgebuild(workdir, local_store, "-j", "1")
        client.get_task_stream(start=time.time())  # registers the scheduler's task stream recorder
        stream_start, cpu_before = time.time(), workers_cpu_seconds(client)
        cluster_cold = edgebuild(workdir, cluster_store, "--executor", executor)
        workers_cpu = workers_cpu_seconds(client) - cpu_before
        records = client.get_task_stream(start=stream_start)
        schedule = task_stream(records, workers)
        shutil.rmtree(workdir / "out")  # no up-to-date stamp: every stage goes through the store
        local_cached = edgebuild(workdir, local_store, "-j", "1")
        shutil.rmtree(workdir / "out")
        cluster_cached = edgebuild(workdir, cluster_store, "--executor", executor)
    tasks = stage_tasks(local_cold.report)
    # keys agree until a stage's output carries Core ML's random package identifiers (uuid4 item
    # names, as in any two builds); the stages after it take that output's digest
    local_keys = {s["key"] for v in local_cold.report["variants"] for s in v["stages"]}
    cluster_keys = {s["key"] for v in cluster_cold.report["variants"] for s in v["stages"]}
    local_work = sum(stage_seconds(local_cold.report).values())
    numbers = {
        "variants": len(local_cold.report["variants"]),
        "stage_tasks": tasks,
        "stage_keys_shared_with_local": len(local_keys & cluster_keys),
        "warm_workers": not args.cold_workers,
        "local_j1_cold_s": round(local_cold.seconds, 2),
        # the ceiling of any speed-up on this machine: cores / cores -j 1 already keeps busy
        "local_j1_cpu_utilisation": round(local_cold.cpu_seconds / local_cold.seconds, 2),
        "local_j1_stage_bodies_s": round(local_work, 2),
        "local_j1_critical_path_s": round(critical_path(local_cold.report), 2),
        "dask_2_workers_cold_s": round(cluster_cold.seconds, 2),
        "dask_cpu_utilisation": round((cluster_cold.cpu_seconds + workers_cpu) / cluster_cold.seconds, 2),
        "dask_stage_bodies_s": round(sum(stage_seconds(cluster_cold.report).values()), 2),
        "dask_critical_path_s": round(critical_path(cluster_cold.report), 2),
        "stage_bodies_s_by_stage": {"local_j1": by_stage(local_cold.report), "dask": by_stage(cluster_cold.report)},
        "speedup": round(local_cold.seconds / cluster_cold.seconds, 2),
        "local_j1_cached_s": round(local_cached.seconds, 2),
        "dask_2_workers_cached_s": round(cluster_cached.seconds, 2),
        "overhead_per_stage_ms": round((cluster_cached.seconds - local_cached.seconds) / tasks * 1000, 1),
        "cpus": os.cpu_count(),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "dask_schedule": schedule,
    }
    if args.json:
        print(json.dumps(numbers))
    else:
        for name, value in numbers.items():
            print(f"{name:<30} {value}")
    if args.keep:  # the raw material: both cold runs' reports and the cluster's task stream
        for name, data in (("local-cold.json", local_cold.report), ("dask-cold.json", cluster_cold.report),
                           ("task-stream.json", records)):
            (workdir / name).write_text(json.dumps(data, default=str))
    else:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
