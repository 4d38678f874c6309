"""Run a built artifact: ``InferenceSession(path).run(inputs)`` for a bundle or an ``.mlpackage``.

Segments run through registered runtimes (``edgebuild_register_runtimes``): the first whose
``can_run(path)`` accepts the segment's artifact, native runtimes (Core ML on macOS) first
unless ``native=False``. On Linux those are the reference executors (the MIL interpreter, the
MPSGraph program executor, the MSL CPU emulation).

Names: a session takes and returns the source model's (ONNX) names. Where an artifact had to
rename a tensor (Core ML takes only identifier-like names), the bundle manifest's ``binding``
or the runtime's ``tensor_names`` says what the artifact calls it, and the session translates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np

from edgebuild.store.lockfile import read_lock
from edgebuild.bundle.manifest import (
    MANIFEST,
    Manifest,
    SegmentSpec,
    TensorSpec,
    read_manifest,
)
from edgebuild.bundle.decoding import Decoder
from edgebuild.errors import BuildError, UsageError


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


def named_runner(runtime, artifact: Path):
    """``run(inputs) -> outputs`` of ``runtime`` on ``artifact``, both by the source model's names.

    ``runtime.run`` speaks the artifact's names; ``runtime.tensor_names`` gives the renamed ones.
    """
    names = runtime.tensor_names(artifact)
    to_artifact = dict(names.get("inputs") or {})
    to_source = {artifact_name: source for source, artifact_name in (names.get("outputs") or {}).items()}
    taken = runtime.input_names(artifact)
    expected = None if taken is None else [next((s for s, a in to_artifact.items() if a == name), name) for name in taken]

    def run(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if expected is not None:
            missing = [name for name in expected if name not in inputs]
            if missing:
                raise BuildError(f"{artifact}: input(s) {', '.join(map(repr, missing))} not given "
                                 f"(the model takes {', '.join(map(repr, expected))})",
                                 hint="feed the inputs by the source model's names")
        produced = runtime.run(artifact, {to_artifact.get(k, k): v for k, v in inputs.items()})
        return {to_source.get(k, k): v for k, v in produced.items()}

    return run


class InferenceSession:
    """A bundle directory (``manifest.json``), a single artifact a runtime runs (an ``.mlpackage``), or a
    variant's output directory (its lock file names the artifact), ready to run."""

    def __init__(self, path: str | Path, *, registry=None, native: bool = True):
        self.path = Path(path)
        if not self.path.exists():
            raise UsageError(f"{self.path}: no such file or directory",
                             hint="give a bundle directory, an artifact, or a variant's output directory")
        if registry is None:
            from edgebuild.registry import get_registry

            registry = get_registry()
        runtimes = [registry.get("runtimes", name) for name in registry.names("runtimes")]
        self._runtimes = sorted(runtimes, key=lambda r: not r.native) if native else [r for r in runtimes if not r.native]
        built = (read_lock(self.path) or {}).get("artifact") if self.path.is_dir() else None
        if isinstance(built, str) and built and (self.path / built).exists():
            self.path = self.path / built  # a variant's output directory
        self.manifest: Manifest | None = None
        self._single = None  # the named runner of a single artifact, made on first use
        self._decoder: Decoder | None = None  # a stateful artifact's state and position, opened on first use
        self._stateless = False  # the artifact was asked and keeps no state
        if (self.path / MANIFEST).exists():
            self.manifest = read_manifest(self.path)
        elif not any(runtime.can_run(self.path) for runtime in self._runtimes):
            raise BuildError(f"{self.path}: neither a bundle (no {MANIFEST}) nor an artifact an installed runtime runs",
                             hint="check `edgebuild plugins` for the backend that built it")

    def runtime_for(self, artifact: Path):
        for runtime in self._runtimes:
            if runtime.can_run(artifact):
                return runtime
        raise BuildError(f"{artifact}: no installed runtime can run this segment",
                         hint="install the plugin of its backend; `edgebuild plugins` lists the runtimes installed")

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Outputs by name. A stateful artifact (a decoder built with a generate section) reads and
        updates the session's state: feed ``input_ids`` [1, Q], and ``position`` or nothing (the
        tokens cached so far)."""
        decoder = self._stateful()
        if decoder is not None:
            return decoder.run(dict(inputs))
        if self.manifest is None:
            if self._single is None:
                self._single = named_runner(self.runtime_for(self.path), self.path)
            return dict(self._single(dict(inputs)))
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


    # -- stateful artifacts (decoders with their KV cache in the artifact's state) -----------
    def _stateful(self) -> Decoder | None:
        if self._decoder is None and not self._stateless and self.manifest is None:
            model = self.runtime_for(self.path).open_stateful(self.path)
            if model is None:
                self._stateless = True
            else:
                self._decoder = Decoder(model, str(self.path))
        return self._decoder

    def _decoder_or_fail(self, what: str) -> Decoder:
        decoder = self._stateful()
        if decoder is None:
            raise BuildError(f"{self.path}: {what} needs a stateful artifact (a decoder built from a recipe with a "
                             "generate section); this one keeps no state",
                             hint="add a generate section to the recipe (target.deployment_target iOS18 or later) "
                                  "and rebuild")
        return decoder

    @property
    def position(self) -> int:
        """Tokens in the cache of a stateful artifact (0 for any other)."""
        decoder = self._stateful()
        return decoder.position if decoder is not None else 0

    def reset(self) -> None:
        """Empty the cache of a stateful artifact."""
        self._decoder_or_fail("reset()").reset()

    def generate(self, prompt_ids, max_new_tokens: int, *, return_logits: bool = False):
        """Greedy generation from an empty cache: the prompt is fed in chunks of the artifact's query
        lengths (largest first, then 1), then one token at a time. Returns the new token ids, and
        with ``return_logits`` also the logits [steps, V] of the step that chose each token."""
        tokens, logits = self._decoder_or_fail("generate()").generate_tokens(prompt_ids, max_new_tokens)
        return (tokens, logits) if return_logits else tokens


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
