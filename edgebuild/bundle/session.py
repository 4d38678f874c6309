"""Run a built artifact: ``InferenceSession(path).run(inputs)`` for a bundle or an ``.mlpackage``.

Segments run through registered runtimes (``edgebuild_register_runtimes``): the first whose
``can_run(path)`` accepts the segment's artifact. On Linux those are the reference executors
(the MIL interpreter, the MPSGraph program executor, the MSL CPU emulation); on macOS Core ML
segments run through Core ML itself unless ``native=False``.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Mapping

import numpy as np

from edgebuild.bundle.manifest import (
    MANIFEST,
    Manifest,
    SegmentSpec,
    TensorSpec,
    read_manifest,
)
from edgebuild.errors import BuildError


class CoreMLNativeRuntime:
    """Core ML's own predict (macOS only): what an app would get."""

    name = "coreml"

    def can_run(self, artifact: Path) -> bool:
        return platform.system() == "Darwin" and Path(artifact).suffix in (".mlpackage", ".mlmodel")

    def run(self, artifact: Path, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        import coremltools as ct

        model = ct.models.MLModel(str(artifact))
        return {k: np.asarray(v) for k, v in model.predict(dict(inputs)).items()}


def _artifact_of(root: Path, segment: SegmentSpec) -> Path:
    """The path a runtime is asked about: the Core ML package itself, else the segment directory."""
    model = segment.files.get("model")
    return root / model if model else root / segment.path


def _feed(specs: list[TensorSpec], values: Mapping[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
    feed = {}
    for spec in specs:
        if spec.name not in values:
            raise BuildError(f"{where}: input {spec.name!r} was not given (expected {spec.dtype} {spec.shape})")
        array = np.asarray(values[spec.name])
        if array.size != int(np.prod(spec.shape, dtype=np.int64)):
            raise BuildError(f"{where}: input {spec.name!r} has shape {list(array.shape)}, expected {spec.shape}")
        feed[spec.binding or spec.name] = np.ascontiguousarray(array.astype(spec.dtype, copy=False).reshape(spec.shape))
    return feed


class InferenceSession:
    """A bundle directory (``manifest.json``) or a single ``.mlpackage``, ready to run."""

    def __init__(self, path: str | Path, *, registry=None, native: bool = True):
        self.path = Path(path)
        if registry is None:
            from edgebuild.registry import get_registry

            registry = get_registry()
        self._runtimes = [registry.get("runtimes", name) for name in registry.names("runtimes")]
        if native:
            self._runtimes.insert(0, CoreMLNativeRuntime())
        if (self.path / MANIFEST).exists():
            self.manifest: Manifest | None = read_manifest(self.path)
        elif self.path.suffix in (".mlpackage", ".mlmodel") or (self.path / "model.mlpackage").exists():
            self.manifest = None
            if self.path.suffix not in (".mlpackage", ".mlmodel"):
                self.path = self.path / "model.mlpackage"
        else:
            raise BuildError(f"{self.path}: neither a bundle (no {MANIFEST}) nor an .mlpackage")

    def runtime_for(self, artifact: Path):
        for runtime in self._runtimes:
            if runtime.can_run(artifact):
                return runtime
        raise BuildError(f"{artifact}: no installed runtime can run this segment",
                         hint="install the plugin of its backend (edgebuild-coreml, edgebuild-mpsgraph, edgebuild-msl)")

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.manifest is None:
            return dict(self.runtime_for(self.path).run(self.path, dict(inputs)))
        values: dict[str, np.ndarray] = {}
        values.update(_feed(self.manifest.inputs, inputs, str(self.path)))
        for segment in self.manifest.segments:
            artifact = _artifact_of(self.path, segment)
            where = f"{self.path.name} segment {segment.index} ({segment.backend})"
            produced = self.runtime_for(artifact).run(artifact, _feed(segment.inputs, values, where))
            for spec in segment.outputs:
                key = spec.binding or spec.name
                if key not in produced:
                    raise BuildError(f"{where}: output {key!r} was not produced (got {', '.join(produced)})")
                values[spec.name] = np.asarray(produced[key]).reshape(spec.shape)
        return {spec.name: values[spec.name].astype(spec.dtype, copy=False) for spec in self.manifest.outputs}


def compare_outputs(result: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> tuple[float, float]:
    """(mean squared error, max absolute difference) over every output both sides have."""
    common = [name for name in reference if name in result]
    if not common:
        raise ValueError(f"no common outputs: result has {sorted(result)}, reference {sorted(reference)}")
    squared, count, worst = 0.0, 0, 0.0
    for name in common:
        got = np.asarray(result[name], dtype=np.float64)
        want = np.asarray(reference[name], dtype=np.float64)
        if got.size != want.size:
            raise ValueError(f"output {name!r}: {got.shape} vs reference {want.shape}")
        diff = np.abs(got.reshape(want.shape) - want)
        squared += float(np.sum(diff * diff))
        count += diff.size
        worst = max(worst, float(np.max(diff)) if diff.size else 0.0)
    return squared / max(count, 1), worst
