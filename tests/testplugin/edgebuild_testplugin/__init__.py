"""Test plugin: the ``testcopy`` backend, whose stages copy files and log each execution, and
a runtime that runs what it built (the copied ONNX model) for ``edgebuild verify``.

``EDGEBUILD_TEST_LOG`` names a file that gets one line per stage body actually run, so
tests can count builds; ``EDGEBUILD_TEST_SLEEP`` makes ``lower`` slow enough to interrupt.
``EDGEBUILD_TEST_GATE`` names a folder that holds the ``test_noop`` pass while a file ``armed``
is in it: the pass writes ``running-<pid>`` there and waits until ``open`` appears, so a test
can find (and kill) the process running a stage at a moment it chooses.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from edgebuild.plugin import Backend, Candidate, GraphPass, RecipeSection, Runtime, Stage, StageInputs, StageParams, hookimpl


def _log(event: str) -> None:
    log = os.environ.get("EDGEBUILD_TEST_LOG")
    if log:
        with open(log, "a") as handle:
            handle.write(f"{event} {os.getpid()}\n")


class CopyCompression(RecipeSection):
    model_config = ConfigDict(extra="forbid")
    level: int = 1
    weights: dict | None = None  # shaped like a real backend's, for the variant-merging tests; copied, not applied


class LowerParams(StageParams):
    precision: str


class CompressParams(StageParams):
    compression: CopyCompression  # the typed section; its dump (defaults applied) is in the key


class PackageParams(StageParams):
    variant: str  # written nowhere, but each variant gets its own package


# the files each stage writes (edgebuild.store.layout): a remote entry holding others is refused
MODEL_FILES = ("model/model.onnx", "model/compression.json")


def lower(params: LowerParams, inputs: StageInputs, out: Path) -> dict:
    _log("lower:start")
    time.sleep(float(os.environ.get("EDGEBUILD_TEST_SLEEP", "0")))
    (out / "model").mkdir()
    shutil.copy(inputs.path("optimize") / "model.onnx", out / "model" / "model.onnx")
    _log("lower:done")
    return {}


def compress(params: CompressParams, inputs: StageInputs, out: Path) -> dict:
    _log("compress")
    shutil.copytree(inputs.path("lower") / "model", out / "model")
    (out / "model" / "compression.json").write_text(json.dumps(params.compression.model_dump(mode="json")))
    return {"level": params.compression.level}


def package(params: PackageParams, inputs: StageInputs, out: Path) -> dict:
    _log("package")
    built = inputs.path("compress" if "compress" in inputs.results else "lower")
    shutil.copytree(built / "model", out / "model")
    return {}


class CopyBackend(Backend):
    validation_runtimes = ("testcopy",)
    default_runtimes = ()  # validated only when the recipe names the runtime

    def stages(self, variant, registry):
        compression = variant.section("testcopy:compression")
        stages = [Stage("lower", LowerParams(precision=variant.recipe.target.precision), ["optimize"], lower,
                        extra={"layout": MODEL_FILES[:1]})]
        if compression is not None:
            stages.append(Stage("compress", CompressParams(compression=compression), ["lower"], compress,
                                extra={"layout": MODEL_FILES}))
        stages.append(Stage("package", PackageParams(variant=variant.name), [stages[-1].name], package,
                            extra={"artifact": "model", "layout": MODEL_FILES}))
        return stages

    def candidates(self, artifact, runtimes, *, precision, emulate_fp16, built, registry):
        from edgebuild_testplugin.validation import candidate

        return {name: Candidate(candidate(Path(artifact)), parallel=False) for name in runtimes}


class CopyRuntime(Runtime):
    """Runs a testcopy artifact, a folder holding the copied model.onnx, with onnxruntime."""

    name = "testcopy"

    def can_run(self, artifact: Path) -> bool:
        return (Path(artifact) / "model.onnx").is_file()

    def input_names(self, artifact: Path) -> list[str]:
        import onnx

        graph = onnx.load(Path(artifact) / "model.onnx", load_external_data=False).graph
        weights = {init.name for init in graph.initializer}
        return [i.name for i in graph.input if i.name not in weights]

    def input_shapes(self, artifact: Path) -> dict[str, list[int]]:
        """The copied model's inputs whose every dim is a fixed size."""
        import onnx

        graph = onnx.load(Path(artifact) / "model.onnx", load_external_data=False).graph
        shapes = {}
        for value in graph.input:
            dims = value.type.tensor_type.shape.dim
            if all(d.HasField("dim_value") and d.dim_value > 0 for d in dims):
                shapes[value.name] = [d.dim_value for d in dims]
        return shapes

    def run(self, artifact: Path, inputs: dict) -> dict:
        import onnxruntime

        session = onnxruntime.InferenceSession(str(Path(artifact) / "model.onnx"), providers=["CPUExecutionProvider"])
        return dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))


class NoopPass(GraphPass):
    default = False
    description = "does nothing (tests switching passes on)"

    def apply(self, model) -> int:
        _wait_at_gate()
        return 0


def _wait_at_gate() -> None:
    gate = os.environ.get("EDGEBUILD_TEST_GATE")
    if not gate or not (Path(gate) / "armed").exists():
        return
    (Path(gate) / f"running-{os.getpid()}").touch()
    while not (Path(gate) / "open").exists():
        time.sleep(0.05)
    (Path(gate) / f"left-{os.getpid()}").touch()


@hookimpl
def edgebuild_register_backends(register):
    register("testcopy", CopyBackend())


@hookimpl
def edgebuild_register_runtimes(register):
    register("testcopy", CopyRuntime())


@hookimpl
def edgebuild_register_recipe_sections(register):
    register("testcopy:compression", CopyCompression)


@hookimpl
def edgebuild_register_passes(register):
    register("test_noop", NoopPass())
