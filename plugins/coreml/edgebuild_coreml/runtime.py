"""Runtimes that execute a Core ML artifact: the MIL interpreter everywhere, Core ML on macOS."""

from __future__ import annotations

from pathlib import Path

ARTIFACT_SUFFIXES = (".mlpackage", ".mlmodel")


class InterpreterRuntime:
    """Runs an .mlpackage's ML Program with edgebuild's MIL interpreter (any OS)."""

    name = "mil-interpreter"

    def can_run(self, artifact: Path) -> bool:
        return Path(artifact).suffix in ARTIFACT_SUFFIXES

    def run(self, artifact: Path, inputs: dict, *, fp16: bool = False) -> dict:
        from edgebuild_coreml.interpreter import run_mlpackage

        return run_mlpackage(artifact, inputs, fp16=fp16)

    def input_names(self, artifact: Path) -> list[str]:
        """The inputs the artifact takes, from its spec (``verify`` checks them against the reference)."""
        import coremltools as ct

        return [i.name for i in ct.utils.load_spec(str(artifact)).description.input]

    def inspect(self, artifact: Path) -> dict:
        from edgebuild_coreml.inspect import inspect_mlpackage

        return inspect_mlpackage(artifact)
