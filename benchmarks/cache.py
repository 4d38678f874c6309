"""Cold, fully cached and no-op builds of recipes/minilm_paraphrase.yaml (paraphrase-MiniLM-L3-v2,
69 MB; fp32 and fp16 variants with validation), measured in one run.

Targets: the fully cached run costs at most 3% of the cold one; a no-op run (nothing
changed, outputs present) takes under 0.5 s wall, interpreter start-up included. A no-op is
answered from the stamp the previous run left (``edgebuild/uptodate.py``); the fully cached run
has no stamp to use, since its outputs were deleted, and goes through every stage's store lookup.

    python benchmarks/cache.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the shipped recipe as a user runs it (fp32 and fp16 variants, 32-sample validation),
# with its outputs redirected into the scratch directory
RECIPE = f"""\
extends: {ROOT / "recipes" / "minilm_paraphrase.yaml"}
outputs: {{dir: out}}
"""


def timed_run(workdir: Path, cache: Path) -> float:
    env = {**os.environ, "EDGEBUILD_CACHE_DIR": str(cache)}
    start = time.perf_counter()
    # ``python -m edgebuild`` is what the ``edgebuild`` command runs
    done = subprocess.run([sys.executable, "-m", "edgebuild", "run", "recipe.yaml"], cwd=workdir, env=env,
                          capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"build failed:\n{done.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it")
    parser.add_argument("--repeat", type=int, default=5, help="no-op runs to take the median of")
    args = parser.parse_args()
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="edgebuild-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "recipe.yaml").write_text(RECIPE)
    cache = workdir / "cache"
    # the download is not the build: fetch the source once into the cache first
    env = {**os.environ, "EDGEBUILD_CACHE_DIR": str(cache)}
    subprocess.run([sys.executable, "-m", "edgebuild.cli.app", "plan", "recipe.yaml"], cwd=workdir, env=env,
                   capture_output=True)
    shutil.rmtree(cache / "objects", ignore_errors=True)

    cold = timed_run(workdir, cache)
    shutil.rmtree(workdir / "out")  # everything in the store, nothing materialised
    cached = timed_run(workdir, cache)
    noop = statistics.median(timed_run(workdir, cache) for _ in range(args.repeat))

    print(f"{'run':<14}{'seconds':>10}{'of cold':>10}  target")
    print(f"{'cold':<14}{cold:>10.2f}{1:>10.1%}")
    print(f"{'fully cached':<14}{cached:>10.2f}{cached / cold:>10.1%}  <= 3%: {'met' if cached / cold <= 0.03 else 'MISSED'}")
    print(f"{'no-op':<14}{noop:>10.2f}{noop / cold:>10.1%}  < 0.5 s: {'met' if noop < 0.5 else 'MISSED'}")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
