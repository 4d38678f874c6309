"""The Python API needs no main guard: a plain script calling ``edgebuild.build`` builds once and
validates, its samples run in the interpreter's worker processes, whatever the start method the
script set. Those workers used to import the script again, each building once more."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

RECIPE = """\
edgebuild: 1
name: net
source: {model: net.onnx}
target: {backend: coreml, precision: float32}
validate: {samples: 4, runtimes: [interpreter], thresholds: {cosine_min: 0.9999}}
outputs: {dir: out}
"""

# No `if __name__ == "__main__":` on purpose. The pool's start is recorded, so the test knows
# the samples ran in worker processes.
SCRIPT = """\
import json, multiprocessing, sys
if sys.argv[1] != "default":
    multiprocessing.set_start_method(sys.argv[1])
import edgebuild
from edgebuild_coreml.interpreter import artifact_runner

with open("top-level.txt", "a") as f:
    f.write("ran\\n")
started = artifact_runner._WorkerPool.__init__

def recording(self, context, workers, *args, **kwargs):
    with open("pools.txt", "a") as f:
        f.write(f"{workers}\\n")
    started(self, context, workers, *args, **kwargs)

artifact_runner._WorkerPool.__init__ = recording
result = edgebuild.build("net.yaml")
built = result["default"]
print(json.dumps({"exit": result.exit_code, "status": built.status, "passed": built.validation.passed,
                  "cosine": built.validation.metrics["interpreter"]["y"]["cosine"]["min"]}))
"""


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    path = tmp_path_factory.mktemp("model") / "net.onnx"
    weight = np.random.default_rng(0).standard_normal((48, 3, 3, 3)).astype(np.float32) * 0.2
    # 2 x 48 x 160 x 160 values per sample: above PROCESS_MIN_ELEMENTS, so samples go to workers
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])], "net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 160, 160])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 48, 160, 160])],
        [numpy_helper.from_array(weight, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path


@pytest.mark.parametrize("method", ["default", "spawn", "forkserver"])
def test_a_script_without_main_guard_builds_once_and_validates(tmp_path, model, method):
    (tmp_path / "net.onnx").write_bytes(model.read_bytes())
    (tmp_path / "net.yaml").write_text(RECIPE)
    (tmp_path / "script.py").write_text(SCRIPT)
    env = {**os.environ, "EDGEBUILD_CACHE_DIR": str(tmp_path / "cache"), "EDGEBUILD_VALIDATE_WORKERS": "2"}
    done = subprocess.run([sys.executable, "script.py", method], cwd=tmp_path, capture_output=True, text=True,
                          env=env, timeout=900)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "top-level.txt").read_text().splitlines() == ["ran"]
    assert (tmp_path / "pools.txt").read_text().splitlines() == ["2"]  # validation ran in two workers
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["exit"] == 0 and result["status"] == "built" and result["passed"]
    assert result["cosine"] > 0.9999


# A Dask worker is a daemonic process, which multiprocessing lets start no children: a build
# there validates its samples in the worker itself.
DAEMONIC = """\
import json, multiprocessing


def build(queue):
    import edgebuild

    result = edgebuild.build("net.yaml")
    built = result["default"]
    queue.put({"exit": result.exit_code, "error": built.error,
               "passed": built.validation is not None and built.validation.passed})


if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    worker = ctx.Process(target=build, args=(queue,), daemon=True)
    worker.start()
    print(json.dumps(queue.get(timeout=600)))
    worker.join(60)
"""


def test_a_build_in_a_daemonic_process_validates_there(tmp_path, model):
    (tmp_path / "net.onnx").write_bytes(model.read_bytes())
    (tmp_path / "net.yaml").write_text(RECIPE)
    (tmp_path / "daemonic.py").write_text(DAEMONIC)
    env = {**os.environ, "EDGEBUILD_CACHE_DIR": str(tmp_path / "cache"), "EDGEBUILD_VALIDATE_WORKERS": "2"}
    done = subprocess.run([sys.executable, "daemonic.py"], cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=900)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"exit": 0, "error": None, "passed": True}
