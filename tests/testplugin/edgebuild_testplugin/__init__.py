"""Test plugin: the ``testcopy`` backend, whose stages copy files and log each execution.

``EDGEBUILD_TEST_LOG`` names a file that gets one line per stage body actually run, so
tests can count builds; ``EDGEBUILD_TEST_SLEEP`` makes ``lower`` slow enough to interrupt.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from edgebuild.dag.stages import Stage
from edgebuild.hookspecs import hookimpl
from edgebuild.protocols import Backend, GraphPass


def _log(event: str) -> None:
    log = os.environ.get("EDGEBUILD_TEST_LOG")
    if log:
        with open(log, "a") as handle:
            handle.write(f"{event} {os.getpid()}\n")


class CopyCompression(BaseModel):
    model_config = ConfigDict(extra="forbid")
    level: int = 1


class CopyBackend(Backend):
    def stages(self, variant, registry, plugins):
        compression = variant.section("testcopy:compression")

        def lower(results, out: Path):
            _log("lower:start")
            time.sleep(float(os.environ.get("EDGEBUILD_TEST_SLEEP", "0")))
            (out / "model").mkdir()
            shutil.copy(results["optimize"].path / "model.onnx", out / "model" / "model.onnx")
            _log("lower:done")
            return {}

        def compress(results, out: Path):
            _log("compress")
            shutil.copytree(results["lower"].path / "model", out / "model")
            (out / "model" / "compression.json").write_text(json.dumps(variant.params["compression"]))
            return {"level": compression.level}

        def package(results, out: Path):
            _log("package")
            shutil.copytree(results[last].path / "model", out / "model")
            return {}

        stages = [Stage("lower", {"precision": variant.recipe.target.precision}, ["optimize"], plugins, produce=lower)]
        last = "lower"
        if compression is not None:
            stages.append(Stage("compress", {"compression": variant.params["compression"]}, ["lower"], plugins,
                                produce=compress))
            last = "compress"
        stages.append(Stage("package", {"variant": variant.name}, [last], plugins, produce=package,
                            extra={"artifact": "model"}))
        return stages


class NoopPass(GraphPass):
    default = False
    description = "does nothing (tests switching passes on)"

    def apply(self, model) -> int:
        return 0


@hookimpl
def edgebuild_register_backends(register):
    register("testcopy", CopyBackend())


@hookimpl
def edgebuild_register_recipe_sections(register):
    register("testcopy:compression", CopyCompression)


@hookimpl
def edgebuild_register_passes(register):
    register("test_noop", NoopPass())
