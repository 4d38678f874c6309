"""`edgebuild validate` on recipes with 1,000, 5,000 and 10,000 variants (each a small override),
timed as a user runs it, interpreter start-up included.

Target: 10,000 variants in under 5 s, and time about linear in the variants (10k / 1k under 15:
start-up is a fixed part of the small run). The test backend (tests/testplugin) builds nothing,
so only loading and checking is measured.

    python benchmarks/recipe_load.py [--counts 1000,5000,10000] [--json]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEADER = """\
edgebuild: 1
name: many
source:
  model: m.onnx
  inputs:
    x: {shape: [2, 4], dtype: float32}
target: {backend: testcopy, precision: float32}
variants:
"""


def write_model(path: Path) -> None:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.full((4,), 2.0, dtype=np.float32), "w")
    graph = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["y"])], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def timed_validate(workdir: Path, count: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one `edgebuild validate`: CPU time says the same on a busy machine."""
    recipe = workdir / f"recipe{count}.yaml"
    recipe.write_text(HEADER + "".join(f"  v{i}: {{target: {{precision: float16}}}}\n" for i in range(count)))
    start, cpu = time.perf_counter(), _children_cpu()
    done = subprocess.run([sys.executable, "-m", "edgebuild", "validate", recipe.name], cwd=workdir,
                          capture_output=True, text=True)
    elapsed, cpu = time.perf_counter() - start, _children_cpu() - cpu
    if done.returncode != 0:
        sys.exit(f"validate failed on {count} variants:\n{done.stderr[-2000:]}")
    return elapsed, cpu


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1000,5000,10000", help="variant counts, comma-separated")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    with tempfile.TemporaryDirectory() as scratch:
        workdir = Path(scratch)
        write_model(workdir / "m.onnx")
        seconds = {count: timed_validate(workdir, count) for count in counts}
    ratio = seconds[counts[-1]][1] / seconds[counts[0]][1]
    if args.json:
        print(json.dumps({"wall_seconds": {c: s[0] for c, s in seconds.items()},
                          "cpu_seconds": {c: s[1] for c, s in seconds.items()},
                          "cpu_ratio": ratio, "count_ratio": counts[-1] / counts[0]}))
        return
    for count, (elapsed, cpu) in seconds.items():
        print(f"{count:>6} variants: {elapsed:6.2f} s wall, {cpu:6.2f} s CPU")
    print(f"{counts[-1]} / {counts[0]} variants: {ratio:.1f}x the CPU time for {counts[-1] / counts[0]:.0f}x the variants")


if __name__ == "__main__":
    main()
