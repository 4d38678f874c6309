"""What each ``optimize.level`` gives: graph size, build time, artifact size, the compute plan's
estimate and the validation cosine, for shipped recipes, against O2 (the default) in the same run.

Each recipe is built at O0, O1, O2 and O3 with ``edgebuild run --json`` (a small recipe that
``extends:`` the shipped one, with fewer validation samples), in one store per recipe, so the
source is resolved and imported once and every level pays its own optimize, lower and package
stages. Per level it reads the variant's report.json: the optimize stage's node count, the
seconds of the optimize and lower stages, the artifact's bytes, the plan's estimated time and
Neural Engine share, the rewrites the lower stage ran and the lowest cosine of any output.

    python benchmarks/optimize_levels.py [--recipes ppocr_cls:fp16,minilm_paraphrase:fp16] [--samples 2] [--json]

Ratios are each level's value over O2's. The plan's times are the cost model's estimate for the
recipe's chip, not a measurement on a Mac.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LEVELS = ("O0", "O1", "O2", "O3")
DEFAULT = ("orientation:fp16", "ppocr_cls:fp16", "minilm_paraphrase:fp16")
COMPARED = ("nodes", "build_seconds", "artifact_bytes", "estimated_ms")


def build(recipe: str, variant: str, level: str, samples: int, workdir: Path) -> dict:
    """One build at ``level``; its row."""
    small = workdir / f"{recipe}_{level}.yaml"
    small.write_text(f"extends: {json.dumps(str(ROOT / 'recipes' / f'{recipe}.yaml'))}\n"
                     f"optimize: {{level: {level}}}\nvalidate: {{samples: {samples}}}\n"
                     f"outputs: {{dir: {json.dumps(str(workdir / level))}}}\n")
    done = subprocess.run([sys.executable, "-m", "edgebuild.cli.app", "run", str(small), "--variant", variant,
                           "--cache-dir", str(workdir / "cache"), "--json"], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))
    row = {"recipe": recipe, "variant": variant, "level": level}
    try:
        [record] = json.loads(done.stdout)["variants"]
    except (ValueError, KeyError):
        return {**row, "status": "failed", "error": done.stderr.strip().splitlines()[-1:] or ["no output"]}
    if record["status"] != "built":
        return {**row, "status": "failed", "error": record.get("error")}
    report = json.loads(Path(record["report_json"]).read_text())
    seconds = {stage["name"]: stage["seconds"] for stage in record["stages"]}
    plan = report.get("plan") or {}
    metrics = ((report.get("validation") or {}).get("runtimes") or {}).get("interpreter", {}).get("metrics", {})
    cosines = [m["cosine"]["min"] for m in metrics.values() if isinstance(m, dict) and "cosine" in m]
    return {**row, "status": "built", "nodes": report["optimize"]["nodes_after"],
            "passes_fired": sorted(name for name, count in report["optimize"]["rules"].items() if count),
            "build_seconds": round(sum(seconds.get(s, 0.0) for s in ("optimize", "lower", "package")), 3),
            "artifact_bytes": sum(record.get("artifact_sizes", {}).values()),
            "estimated_ms": plan.get("total_ms"), "ane_share": (plan.get("breakdown") or {}).get("ane"),
            "rewrites": (report.get("lower") or {}).get("rewrites", {}),
            "cosine_min": round(min(cosines), 7) if cosines else None}


def with_ratios(rows: list[dict]) -> list[dict]:
    """Each row with ``<metric>_vs_O2``: its value over the O2 row's of the same recipe."""
    base = {(r["recipe"], r["variant"]): r for r in rows if r["level"] == "O2" and r["status"] == "built"}
    for row in rows:
        o2 = base.get((row["recipe"], row["variant"]))
        for metric in COMPARED:
            value, reference = row.get(metric), (o2 or {}).get(metric)
            if value is not None and reference:
                row[f"{metric}_vs_O2"] = round(value / reference, 3)
    return rows


def print_table(rows: list[dict]) -> None:
    header = ("recipe:variant", "level", "nodes", "x O2", "build s", "x O2", "artifact KB", "est ms", "x O2",
              "ANE %", "cosine min", "rewrites")
    print(" | ".join(header))
    for r in rows:
        if r["status"] != "built":
            print(f"{r['recipe']}:{r['variant']} | {r['level']} | failed: {r.get('error')}")
            continue
        print(" | ".join(str(v) for v in (
            f"{r['recipe']}:{r['variant']}", r["level"], r["nodes"], r.get("nodes_vs_O2"), r["build_seconds"],
            r.get("build_seconds_vs_O2"), round(r["artifact_bytes"] / 1024, 1), r["estimated_ms"],
            r.get("estimated_ms_vs_O2"), r["ane_share"], r["cosine_min"], r["rewrites"] or "")))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", default=",".join(DEFAULT), help="recipe:variant pairs, comma-separated")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    for pair in args.recipes.split(","):
        recipe, _, variant = pair.partition(":")
        with tempfile.TemporaryDirectory(prefix=f"levels-{recipe}-") as folder:
            for level in LEVELS:
                rows.append(build(recipe, variant or "fp32", level, args.samples, Path(folder)))
                print(f"{recipe}:{variant} {level} {rows[-1]['status']}", file=sys.stderr)
    rows = with_ratios(rows)
    if args.json:
        print(json.dumps({"rows": rows}, indent=2))
    else:
        print_table(rows)
    return 0 if all(r["status"] == "built" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
