"""The MIL interpreter as a runtime: it executes a Core ML artifact on any OS."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from edgebuild.plugin import Runtime

ARTIFACT_SUFFIXES = (".mlpackage", ".mlmodel")


class InterpreterRuntime(Runtime):
    """Runs an .mlpackage's ML Program with edgebuild's MIL interpreter (any OS).

    ``run`` is called once per sample: the last package read is kept (with its interpreter
    plan) while its files are unchanged, so a sample costs its arithmetic, not a reload.
    """

    name = "mil-interpreter"

    def __init__(self):
        self._loaded: tuple | None = None  # (path, stamp, program)
        self._lock = threading.Lock()

    def can_run(self, artifact: Path) -> bool:
        return Path(artifact).suffix in ARTIFACT_SUFFIXES

    def run(self, artifact: Path, inputs: dict, *, fp16: bool = False) -> dict:
        from edgebuild_coreml.interpreter import run_program

        return run_program(self._program(Path(artifact)), inputs, fp16=fp16)

    def _program(self, artifact: Path):
        from edgebuild_coreml.interpreter import load_mlpackage

        stamp = _stamp(artifact)
        with self._lock:
            if self._loaded is not None and self._loaded[:2] == (artifact.resolve(), stamp):
                return self._loaded[2]
            self._loaded = None  # drop the previous program before reading the next
            program = load_mlpackage(artifact)
            self._loaded = (artifact.resolve(), stamp, program)
            return program

    def input_names(self, artifact: Path) -> list[str]:
        """The inputs the artifact takes, from its spec (``verify`` checks them against the reference)."""
        import coremltools as ct

        return [i.name for i in ct.utils.load_spec(str(artifact)).description.input]

    def input_shapes(self, artifact: Path) -> dict[str, list[int]]:
        return package_input_shapes(artifact)

    def tensor_names(self, artifact: Path) -> dict:
        return package_tensor_names(artifact)

    def inspect(self, artifact: Path) -> dict:
        from edgebuild_coreml.inspect import inspect_mlpackage

        return inspect_mlpackage(artifact)

    def open_stateful(self, artifact: Path):
        description = generate_description(artifact)
        if description is None:
            return None
        return InterpretedState(self._program(Path(artifact)), description)


class InterpretedState:
    """A stateful program run by the interpreter, its states (numpy arrays) kept between calls."""

    def __init__(self, program, generate: dict):
        self.program = program
        self.generate = generate
        self.states: dict = {}  # state name -> array; absent: zeros, as Core ML's make_state()

    def run(self, inputs: dict) -> dict:
        from edgebuild_coreml.interpreter import run_program

        return run_program(self.program, inputs, states=self.states)

    def reset(self) -> None:
        self.states = {}


def generate_description(artifact: Path) -> dict | None:
    """The ``edgebuild.generate`` metadata of a stateful package (lowering.stateful), else None."""
    import json

    import coremltools as ct

    from edgebuild_coreml.lowering.stateful import METADATA_KEY

    if Path(artifact).suffix not in ARTIFACT_SUFFIXES:
        return None
    text = ct.utils.load_spec(str(artifact)).description.metadata.userDefined.get(METADATA_KEY)
    return json.loads(text) if text else None


def package_input_shapes(artifact: Path) -> dict[str, list[int]]:
    """The shape of each array input of a package's spec (a flexible one's default shape)."""
    import coremltools as ct

    shapes = {}
    for feature in ct.utils.load_spec(str(artifact)).description.input:
        if feature.type.WhichOneof("Type") == "multiArrayType":
            shapes[feature.name] = [int(d) for d in feature.type.multiArrayType.shape]
    return shapes


def package_tensor_names(artifact: Path) -> dict:
    """The renamings a package records (``edgebuild_coreml.lowering.names``): {"inputs": {...}, "outputs": {...}}."""
    import coremltools as ct

    from edgebuild_coreml.lowering.names import read_metadata

    return read_metadata(ct.utils.load_spec(str(artifact)).description.metadata.userDefined)


def _stamp(artifact: Path) -> tuple:
    """(path, size, mtime_ns) of every file of the model (spec and weights): changes when it is
    rewritten. A package's Manifest.json is left out: coremltools rewrites it on every read."""
    data = artifact / "Data"
    files = sorted(p for p in data.rglob("*") if p.is_file()) if artifact.is_dir() else [artifact]
    stamp = []
    for path in files:
        try:
            info = os.stat(path)
        except OSError:
            continue
        stamp.append((str(path), info.st_size, info.st_mtime_ns))
    return tuple(stamp)
