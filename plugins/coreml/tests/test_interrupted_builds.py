"""Ctrl-C stops a Core ML build in every stage: exit 130 soon after, nothing half-written, and
the next run builds a correct artifact.

Each test starts ``edgebuild run -v`` (which prints a line as each stage starts), sends SIGINT
when the chosen stage's start line appears on stderr, and checks the exit code, that the process
ended long before the build would have, that the store holds no temporary and no entry of the
interrupted stage, and that a rerun builds the variant and passes its validation thresholds.

By default: a tiny convolutional model, interrupted in ``lower`` (where coremltools' imports
used to swallow the interrupt) and, with two variants on worker threads (``-j 2``), in
``compress``. Under ``-m slow``: every stage of the shipped orientation classifier. (The
executor's own handling of interrupts is tested in the core's tests.)
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]
STOP_WITHIN_SECONDS = 20  # "about two seconds"; generous so a loaded machine does not fail the test
STAGES = ["resolve", "import", "optimize", "lower", "compress", "package", "validate"]

TINY_RECIPE = """\
edgebuild: 1
name: tinyconv
source:
  model: conv.onnx
  inputs: {x: {shape: [1, 3, 16, 16], dtype: float32}}
target: {backend: coreml, deployment_target: iOS17, precision: float32}
compression:
  weights: {mode: linear, dtype: int8}
  weight_threshold: 64
validate:
  samples: 2
  inputs: {x: {random: {low: 0.0, high: 1.0, seed: 0}}}
  thresholds: {cosine_min: 0.99}
outputs: {dir: out}
"""

# The shipped recipe with a compression section (so every stage exists) and fewer samples.
ORIENTATION_RECIPE = """\
extends: {shipped}
compression:
  weights: {{mode: palettize, nbits: 8}}
validate: {{samples: 4, thresholds: {{cosine_min: 0.99, max_rel_max: null}}}}
outputs: {{dir: out}}
"""


def conv_model(path: Path) -> Path:
    """conv 3x3 (8 channels) -> relu -> global average pool -> flatten -> gemm to 4 classes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b"),
        numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "fc"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def started(line: str, stage: str) -> bool:
    """Is ``line`` the -v line announcing that ``stage`` starts (not the line saying it finished)?"""
    return bool(re.search(rf"\b{stage}\b", line)) and not re.search(r"\b(ran|cached)\b", line)


def interrupt_at(recipe: Path, stage: str, cache: Path, *args: str) -> tuple[int, float, str]:
    """Run the build, SIGINT it as ``stage`` starts: (exit code, seconds from signal to exit, stderr)."""
    env = dict(os.environ, EDGEBUILD_CACHE_DIR=str(cache), PYTHONWARNINGS="ignore")
    proc = subprocess.Popen([sys.executable, "-m", "edgebuild.cli.app", "run", str(recipe), "-v", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=recipe.parent)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    seen = []
    deadline = time.monotonic() + 600
    try:
        while True:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                assert proc.poll() is None, f"the build ended before {stage} started:\n{''.join(seen)}"
                assert time.monotonic() < deadline, f"{stage} never started:\n{''.join(seen)}"
                continue
            seen.append(line)
            if started(line, stage):
                break
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        code = proc.wait(timeout=300)
        elapsed = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    time.sleep(0.2)  # let the reader drain what is left
    while not lines.empty():
        seen.append(lines.get())
    return code, elapsed, "".join(seen)


def assert_nothing_half_written(cache: Path, stage: str, workdir: Path) -> None:
    leftovers = list((cache / "tmp").glob("*")) if (cache / "tmp").exists() else []
    assert not leftovers, f"temporaries left in the store: {leftovers}"
    stored = {json.loads(meta.read_text())["stage"] for meta in (cache / "objects").glob("*/*/meta.json")}
    assert stage not in stored, f"the interrupted {stage} stage has a store entry"
    assert not (workdir / "out").exists(), "an output directory was written"
    assert not list(cache.glob("stamps/*.json")), "an interrupted run was stamped as up to date"


def assert_rerun_builds(recipe: Path, cache: Path, stage: str, *args: str) -> None:
    env = dict(os.environ, EDGEBUILD_CACHE_DIR=str(cache), PYTHONWARNINGS="ignore")
    done = subprocess.run([sys.executable, "-m", "edgebuild.cli.app", "run", str(recipe), "--json", *args],
                          capture_output=True, text=True, env=env, cwd=recipe.parent, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    variants = json.loads(done.stdout)["variants"]
    (variant,) = variants
    assert variant["status"] == "built" and variant["validation"]["failures"] == []
    statuses = {s["name"]: s["status"] for s in variant["stages"]}
    assert stage == "resolve" or statuses[stage] == "ran"  # the interrupted stage was not cached
    (artifact,) = variant["artifacts"]
    assert (Path(artifact) / "Manifest.json").exists()


def test_ctrl_c_with_two_core_ml_variants_on_worker_threads(tmp_path):
    """-j 2: interrupted in compress, then rebuilt; coremltools' stages take turns, so both variants build."""
    conv_model(tmp_path / "conv.onnx")
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(TINY_RECIPE + "variants:\n  a: {}\n  b: {compression: {weights: {mode: linear, dtype: int8, "
                      "granularity: per_tensor}}}\n")
    cache = tmp_path / "cache"
    code, elapsed, stderr = interrupt_at(recipe, "compress", cache, "-j", "2")
    assert code == 130 and elapsed < STOP_WITHIN_SECONDS, stderr[-3000:]
    assert not list(cache.glob("tmp/*")) and not (tmp_path / "out").exists()
    env = dict(os.environ, EDGEBUILD_CACHE_DIR=str(cache), PYTHONWARNINGS="ignore")
    done = subprocess.run([sys.executable, "-m", "edgebuild.cli.app", "run", str(recipe), "-j", "2", "--json"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    variants = json.loads(done.stdout)["variants"]
    assert [(v["variant"], v["status"]) for v in variants] == [("a", "built"), ("b", "built")]
    assert all(v["validation"]["failures"] == [] for v in variants)


def check_interrupt(recipe: Path, stage: str, cache: Path, *args: str) -> None:
    code, elapsed, stderr = interrupt_at(recipe, stage, cache, *args)
    assert code == 130, stderr[-3000:]
    assert elapsed < STOP_WITHIN_SECONDS, f"took {elapsed:.1f} s to stop:\n{stderr[-3000:]}"
    assert "interrupted" in stderr and "Traceback" not in stderr
    assert_nothing_half_written(cache, stage, recipe.parent)
    assert_rerun_builds(recipe, cache, stage, *args)


def test_ctrl_c_stops_the_lower_stage_of_a_core_ml_build(tmp_path):
    conv_model(tmp_path / "conv.onnx")
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(TINY_RECIPE)
    check_interrupt(recipe, "lower", tmp_path / "cache")


@pytest.mark.slow
@pytest.mark.parametrize("stage", STAGES)
def test_ctrl_c_stops_every_stage_of_a_real_model_build(stage, tmp_path):
    recipe = tmp_path / "orientation.yaml"
    recipe.write_text(ORIENTATION_RECIPE.format(shipped=json.dumps(str(ROOT / "recipes" / "orientation.yaml"))))
    check_interrupt(recipe, stage, tmp_path / "cache", "--variant", "fp32")
