"""The fixed costs of a small build: cold convert, the validate stage's fixed cost, a fully cached
run, a no-op and a warm rebuild in ``edgebuild watch``, each in fresh processes, in one run.

For each model (the demo recipe's orientation classifier and the text-direction classifier, both
small CNNs; ``--models`` names recipes in ``recipes/``), with the model copied to a local file
first (a download is not a build's fixed cost):

- **cold convert**: ``edgebuild convert MODEL -o M.mlpackage`` into an empty store, validation
  included (the command's default recipe: fp16, 8 samples); wall time, and each stage's seconds
  from the report. Its **floor** beside it: a fresh process importing only the libraries the
  stages use, plus the same build again in one warm process (``edgebuild.build`` a second time,
  into another empty store): what is left when nothing but the work is paid for.
- **validate fixed cost**: the validate stage of the convert's recipe with 6 and with 12 samples,
  each from a fresh process with every other stage cached; the stage's seconds are
  ``fixed + samples x per_sample``, so ``fixed = 2 T(6) - T(12)`` (worker start, the package read
  and planned, the reference's session, the inputs drawn).
- **fully cached run**: ``edgebuild run`` with the outputs deleted and every stage in the store.
- **no-op**: the same command again (answered from its stamp): the median of ``--repeat`` runs.
- **watch**: ``edgebuild watch`` on the recipe; once it waits, a threshold edit that only judges
  (a ``max_abs_max`` added: no stage runs, the stored measurements are judged again), and the
  time from the edit to the rebuilt result. Then a ``cosine_min`` edit, timed the same way: in an
  fp16 build that limit is also what the lower stage's fp16 guard keeps ops in fp32 for, so the
  stages from ``lower`` on run again (imports warm); which ran is listed.

Every process reads compiled bytecode, as an installed edgebuild's does (pip compiles it on install):
the processes write it to a folder of the run's own (``PYTHONPYCACHEPREFIX``), filled by an untimed
convert first. An editable checkout under ``PYTHONDONTWRITEBYTECODE`` otherwise compiles its ~300
modules from source in every process (0.3-0.6 s of a cold convert here, none of it a build's cost).

Targets: cold convert <= 2.5 s, validate fixed cost <= 0.3 s, cached <= 0.25 s, no-op <= 0.1 s,
watch rebuild <= 0.5 s (wall, interpreter start-up included). Absolute times are this machine's,
in this run; ``--json`` prints the rows.

    python benchmarks/first_build.py [--models orientation,ppocr_cls] [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("orientation", "ppocr_cls")
TARGETS = {"cold_s": 2.5, "validate_fixed_s": 0.3, "cached_s": 0.25, "noop_s": 0.1, "watch_s": 0.5}
# what the stages of an ONNX -> Core ML build with validation import, and nothing else
LIBRARIES = ("edgebuild.cli.app", "edgebuild.build.run", "onnx", "onnx_ir", "onnxscript.optimizer", "onnxruntime",
             "edgebuild_coreml.lowering.converter", "edgebuild_coreml.interpreter.executor")
WAIT = 600


def bytecode_env(work: Path) -> dict[str, str]:
    """The environment of a process that reads (and writes) compiled bytecode in the run's own folder."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": str(work / "pycache")}


def edgebuild(args: list[str], cwd: Path, cache: Path) -> tuple[float, subprocess.CompletedProcess]:
    env = {**bytecode_env(cwd.parent), "EDGEBUILD_CACHE_DIR": str(cache)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "edgebuild", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=WAIT)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"edgebuild {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return elapsed, done


def local_model(recipe: str, work: Path) -> Path:
    """The recipe's model as a local file (resolved once, into a store of the benchmark's own)."""
    from edgebuild.build.jobs import load_variants, source_resolver
    from edgebuild.registry import get_registry
    from edgebuild.store.location import open_store

    registry = get_registry()
    [variant] = load_variants([str(ROOT / "recipes" / f"{recipe}.yaml")], ["fp32"], registry)
    source = source_resolver(variant, registry, open_store(work / "downloads"))().path
    target = work / f"{recipe}.onnx"
    shutil.copyfile(source, target)
    return target


def stage_seconds(report: Path) -> dict[str, float]:
    return {s["name"]: s["seconds"] for s in json.loads(report.read_text())["stages"]}


def floor_seconds(recipe: Path, work: Path) -> dict:
    """Imports of a fresh process that loads only what the stages use, and a warm second build."""
    code = f"""
import json, sys, time
start = time.perf_counter()
import edgebuild_coreml  # its lean coremltools import, as the build's process has it
for name in {list(LIBRARIES)!r}:
    __import__(name)
imported = time.perf_counter() - start
import edgebuild
from pathlib import Path
recipe = Path(sys.argv[1])
edgebuild.build(str(recipe), cache_dir=sys.argv[2])  # the first build warms every import and plan
start = time.perf_counter()
result = edgebuild.build(str(recipe), cache_dir=sys.argv[3])
print(json.dumps({{"imports_s": imported, "warm_build_s": time.perf_counter() - start,
                  "exit": result.exit_code}}))
"""
    floor = work / "floor.yaml"
    floor.write_text(f"extends: {recipe.name}\noutputs: {{dir: floor-out}}\n")
    done = subprocess.run([sys.executable, "-c", code, str(floor), str(work / "floor-a"), str(work / "floor-b")],
                          cwd=work, env=bytecode_env(work.parent), capture_output=True, text=True, timeout=WAIT)
    if done.returncode != 0:
        sys.exit(f"the floor's process failed:\n{done.stderr}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return {**found, "floor_s": found["imports_s"] + found["warm_build_s"]}


def validate_fixed(recipe: Path, work: Path, cache: Path) -> dict:
    """``2 T(6) - T(12)`` of the validate stage, each in a fresh process, the other stages cached (the
    convert's recipe validates 8 samples: neither count is in the store yet)."""
    seconds = {}
    for samples in (6, 12):
        variant = work / f"samples{samples}.yaml"
        variant.write_text(f"extends: {recipe.name}\nvalidate: {{samples: {samples}}}\n"
                           f"outputs: {{dir: samples{samples}-out}}\n")
        edgebuild(["run", variant.name], work, cache)
        [report] = (work / f"samples{samples}-out").glob("*/report.json")
        seconds[samples] = stage_seconds(report)["validate"]
    return {"validate_6_s": seconds[6], "validate_12_s": seconds[12],
            "validate_fixed_s": max(0.0, 2 * seconds[6] - seconds[12])}


def watch_rebuild(recipe: Path, work: Path, cache: Path) -> dict:
    """Seconds from an edit to the rebuilt result in ``edgebuild watch``: a limit that only judges,
    then ``cosine_min`` (with the stages that edit ran)."""
    env = {**bytecode_env(work.parent), "EDGEBUILD_CACHE_DIR": str(cache)}
    process = subprocess.Popen([sys.executable, "-m", "edgebuild", "watch", recipe.name], cwd=work, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    timer = threading.Timer(WAIT, process.kill)
    timer.start()
    try:
        def wait_for(needle: str) -> list[str]:
            lines = []
            for line in process.stderr:
                lines.append(line)
                if needle in line:
                    return lines
            sys.exit("edgebuild watch ended early")

        def timed_edit(pattern: str, replacement: str) -> tuple[float, list[str]]:
            edited, edits = re.subn(pattern, replacement, recipe.read_text(), count=1)
            assert edits == 1, f"the recipe has no {pattern!r} to edit"
            start = time.perf_counter()
            recipe.write_text(edited)
            lines = wait_for("watching")
            seconds = time.perf_counter() - start
            return seconds, [m.group(1) for m in map(re.compile(r" (\w+) +ran ").search, lines) if m]

        wait_for("watching")
        judged, judged_ran = timed_edit(r"thresholds: \{", "thresholds: {max_abs_max: 1000.0, ")
        guarded, guarded_ran = timed_edit(r"cosine_min: [0-9.]+", "cosine_min: 0.98")
        return {"watch_s": judged, "watch_ran": judged_ran,
                "watch_cosine_s": guarded, "watch_cosine_ran": guarded_ran}
    finally:
        timer.cancel()
        process.terminate()
        process.wait(WAIT)


def has_watch() -> bool:
    """Whether this edgebuild has ``watch`` (an older one, measured for comparison, may not)."""
    done = subprocess.run([sys.executable, "-m", "edgebuild", "watch", "--help"], capture_output=True, timeout=WAIT)
    return done.returncode == 0


def measure(name: str, repeat: int, work: Path) -> dict:
    work.mkdir(parents=True)
    model = local_model(name, work)
    cache = work / "store"
    # untimed: compiles the bytecode every process after it reads
    edgebuild(["convert", model.name, "-o", "warm-up.mlpackage", "--cache-dir", str(work / "warm-up")], work,
              work / "warm-up")
    cold, _ = edgebuild(["convert", model.name, "-o", f"{name}.mlpackage", "--cache-dir", str(cache)], work, cache)
    recipe = work / f"{name}.edgebuild.yaml"
    [report] = (work / f"{name}.edgebuild").glob("*/report.json")
    row = {"model": name, "weights_mb": model.stat().st_size / 2**20, "cold_s": cold,
           "cold_stages_s": stage_seconds(report)}
    row.update(floor_seconds(recipe, work))
    row.update(validate_fixed(recipe, work, cache))
    edgebuild(["run", recipe.name], work, cache)  # stamps the command
    shutil.rmtree(work / f"{name}.edgebuild")  # the outputs: every stage stays in the store
    row["cached_s"], _ = edgebuild(["run", recipe.name], work, cache)
    row["noop_s"] = statistics.median(edgebuild(["run", recipe.name], work, cache)[0] for _ in range(repeat))
    row.update(watch_rebuild(recipe, work, cache) if has_watch()
               else {"watch_s": None, "watch_ran": [], "watch_cosine_s": None, "watch_cosine_ran": []})
    print(f"{name}: {json.dumps(row)}", file=sys.stderr)
    return row


def print_table(rows: list[dict]) -> None:
    heads = [("cold_s", "cold convert"), ("floor_s", "its floor"), ("validate_fixed_s", "validate fixed"),
             ("cached_s", "cached run"), ("noop_s", "no-op"), ("watch_s", "watch rebuild"),
             ("watch_cosine_s", "watch cosine_min")]
    print(f"{'model':<14}" + "".join(f"{title:>16}" for _, title in heads))
    print(f"{'target (s)':<14}" + "".join(f"{('<= ' + str(TARGETS[k])) if k in TARGETS else '':>16}"
                                          for k, _ in heads))
    print("-" * (14 + 16 * len(heads)))
    for row in rows:
        print(f"{row['model']:<14}" + "".join(f"{row[k]:>16.3f}" if row[k] is not None else f"{'-':>16}"
                                              for k, _ in heads))
    print("\nstage seconds of the cold convert (from its report):")
    for row in rows:
        stages = ", ".join(f"{k} {v:.2f}" for k, v in row["cold_stages_s"].items())
        print(f"  {row['model']}: {stages}; the rest (start-up, reading the model, reports) "
              f"{row['cold_s'] - sum(row['cold_stages_s'].values()):.2f}")
    print("\nstages the watch's edits ran (a limit that only judges; cosine_min):")
    for row in rows:
        if row["watch_s"] is not None:
            print(f"  {row['model']}: {', '.join(row['watch_ran']) or 'none'}; "
                  f"{', '.join(row['watch_cosine_ran']) or 'none'}")
    print("\nits floor: a fresh process's imports of only what the stages use "
          f"({', '.join(LIBRARIES)}) plus the same build in a warm process; validate fixed: 2 T(6) - T(12) "
          "of the validate stage, each from a fresh process; watch rebuild: an added limit that only judges; "
          "watch cosine_min: the fp16 guard's limit, so lower and after run; all wall seconds, this run")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="recipe names in recipes/, comma-separated")
    parser.add_argument("--repeat", type=int, default=5, help="no-op runs to take the median of")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="edgebuild-bench-first-"))
    try:
        rows = [measure(name, args.repeat, work / name) for name in args.models.split(",")]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
