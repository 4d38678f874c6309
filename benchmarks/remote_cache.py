"""Two machines sharing a remote cache: the first builds a set of six recipes and pushes every
stage to an S3 bucket (moto's server on 127.0.0.1, reached through s3fs as any bucket); the
second, with a cold local store, builds the same set. Then a fully cached run served from the
local store, for comparison with the second machine's run served from the remote.

Targets: the second machine runs no stage, and its wall time is at most 10% of the first's.

    python benchmarks/remote_cache.py [--json] [--keep DIR] [--recipes a.yaml,b.yaml,...]

Sources are fetched once before the clock starts and copied to both machines (a download is not
a build, and the resolver's cache is not the remote's business). Needs `edgebuild[remote]` and
`moto[server]` (the test extra).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ["ppocr_cls", "orientation", "facenet_pnet", "facenet_rnet", "silero_vad", "example_ops"]


def _local_source(recipe: str) -> str:
    """A shipped recipe's local model, named by its absolute path (relative ones are read from the
    extending recipe's folder)."""
    import yaml

    model = yaml.safe_load((ROOT / "recipes" / f"{recipe}.yaml").read_text())["source"]["model"]
    return "" if ":" in model else f"source: {{model: {ROOT / 'recipes' / model}}}\n"


def fetch_sources(recipes: list[Path], cache: Path) -> None:
    """Resolve every recipe's source into ``cache`` as ``run`` would, without building anything."""
    from edgebuild.build.jobs import load_variants, source_resolver
    from edgebuild.registry import get_registry
    from edgebuild.store.location import open_store

    registry, store = get_registry(), open_store(cache)
    for variant in load_variants([str(r) for r in recipes], None, registry):
        source_resolver(variant, registry, store)()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def edgebuild(args: list[str], cwd: Path, env: dict) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "edgebuild", *args], cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 3):  # 3: built, a validation threshold missed (still cached and pushed)
        sys.exit(f"edgebuild {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return elapsed, done


def stage_counts(done: subprocess.CompletedProcess) -> dict[str, int]:
    counts: dict[str, int] = {}
    for variant in json.loads(done.stdout)["variants"]:
        for stage in variant["stages"]:
            counts[stage["status"]] = counts.get(stage["status"], 0) + 1
    return counts


def store_bytes(cache: Path) -> int:
    """Bytes of the entries' files (what a pull into an empty store moved)."""
    return sum(p.stat().st_size for p in (cache / "objects").glob("*/*/out/**/*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it")
    parser.add_argument("--recipes", default=",".join(RECIPES), help="names under recipes/ (comma-separated)")
    parser.add_argument("-j", "--jobs", type=int, default=1)
    args = parser.parse_args()
    from moto.server import ThreadedMotoServer

    names = [n.removesuffix(".yaml") for n in args.recipes.split(",") if n]
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="edgebuild-remote-bench-"))
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    base_env = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "bench",
                "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_EC2_METADATA_DISABLED": "true", "EDGEBUILD_REMOTE": "s3://bench/edgebuild"}
    import boto3

    boto3.client("s3", endpoint_url=base_env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                 aws_access_key_id="bench", aws_secret_access_key="bench-secret").create_bucket(Bucket="bench")
    machines = {}
    for name in ("a", "b"):
        folder = workdir / name
        folder.mkdir(parents=True, exist_ok=True)
        for recipe in names:
            (folder / f"{recipe}.yaml").write_text(f"extends: {ROOT / 'recipes' / recipe}.yaml\n"
                                                   + _local_source(recipe) + f"outputs: {{dir: out/{recipe}}}\n")
        machines[name] = (folder, {**base_env, "EDGEBUILD_CACHE_DIR": str(folder / "cache")})
    files = [f"{r}.yaml" for r in names]
    run = ["run", *files, "--json", "-q", "-j", str(args.jobs)]
    try:
        (a, env_a), (b, env_b) = machines["a"], machines["b"]
        fetch_sources([a / f for f in files], a / "cache")  # outside the clock; both machines get a copy
        shutil.copytree(a / "cache" / "sources", b / "cache" / "sources", dirs_exist_ok=True)

        first_s, first = edgebuild(run, a, env_a)
        second_s, second = edgebuild(run, b, env_b)
        pulled_bytes = store_bytes(b / "cache")
        shutil.rmtree(b / "out")  # outputs gone, store full: every stage answered by the local store
        local_s, local = edgebuild([*run, "--no-remote"], b, env_b)
    finally:
        server.stop()
    ran_second = stage_counts(second).get("ran", 0)
    result = {
        "recipes": names,
        "first_machine": {"seconds": round(first_s, 2), "stages": stage_counts(first)},
        "second_machine": {"seconds": round(second_s, 2), "stages": stage_counts(second),
                           "of_first": round(second_s / first_s, 4), "bytes_pulled": pulled_bytes},
        "fully_cached_from_remote": {"seconds": round(second_s, 2), "bytes_moved": pulled_bytes},
        "fully_cached_from_local_store": {"seconds": round(local_s, 2), "bytes_moved": 0,
                                          "stages": stage_counts(local)},
        "targets": {"second_ran_no_stage": ran_second == 0, "second_within_10pct": second_s <= 0.10 * first_s},
    }
    if args.json:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        print(f"{len(names)} recipes: {', '.join(names)}")
        print(f"{'run':<34}{'seconds':>9}{'of first':>10}{'MB moved':>10}  stages")
        print(f"{'first machine (builds, pushes)':<34}{first_s:>9.2f}{1:>10.1%}{'':>10}  {stage_counts(first)}")
        print(f"{'second machine (cold, pulls)':<34}{second_s:>9.2f}{second_s / first_s:>10.1%}"
              f"{pulled_bytes / 1e6:>10.1f}  {stage_counts(second)}")
        print(f"{'fully cached, local store':<34}{local_s:>9.2f}{local_s / first_s:>10.1%}{0:>10.1f}  {stage_counts(local)}")
        print(f"targets: second ran no stage: {'met' if ran_second == 0 else 'MISSED'}; "
              f"second <= 10% of first: {'met' if second_s <= 0.10 * first_s else 'MISSED'}")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
