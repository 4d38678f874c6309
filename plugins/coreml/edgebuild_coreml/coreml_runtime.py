"""Core ML itself as a validation candidate, once per compute unit (macOS only).

On any other OS there is nothing to run, and the validation record says so rather than
pretending: the MIL interpreter is then the only candidate.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Mapping

from edgebuild.plugin import Runtime

COMPUTE_UNITS = ("CPU_ONLY", "CPU_AND_GPU", "CPU_AND_NE")
SKIPPED = "Core ML runs only on macOS; the interpreter's numbers stand in for it here"


def available() -> bool:
    return platform.system() == "Darwin"


def core_ml_runners(artifact: Path, lowered: dict | None = None) -> dict:
    """{runtime name: run(inputs) -> outputs} for each compute unit; {} off macOS. Validate them one
    sample at a time: concurrent predictions were never measured."""
    if not available():
        return {}
    import coremltools as ct
    import numpy as np

    to_mil = (lowered or {}).get("renamed_inputs", {})
    to_onnx = {mil: onnx for onnx, mil in (lowered or {}).get("renamed_outputs", {}).items()}
    runners = {}
    for unit in COMPUTE_UNITS:
        model = ct.models.MLModel(str(artifact), compute_units=getattr(ct.ComputeUnit, unit))

        def run(inputs, model=model):
            outputs = model.predict({to_mil.get(k, k): v for k, v in inputs.items()})
            return {to_onnx.get(k, k): np.asarray(v) for k, v in outputs.items()}

        runners[f"coreml-{unit.lower().replace('_', '-')}"] = run
    return runners


class CoreMLRuntime(Runtime):
    """Core ML's own predict, what an app gets (macOS only): ``InferenceSession`` tries it first there."""

    name = "coreml"
    native = True
    parallel_samples = False

    def can_run(self, artifact: Path) -> bool:
        return available() and Path(artifact).suffix in (".mlpackage", ".mlmodel")

    def input_shapes(self, artifact: Path) -> dict[str, list[int]]:
        from edgebuild_coreml.runtime import package_input_shapes

        return package_input_shapes(artifact)

    def tensor_names(self, artifact: Path) -> dict:
        from edgebuild_coreml.runtime import package_tensor_names

        return package_tensor_names(artifact)

    def run(self, artifact: Path, inputs: Mapping) -> dict:
        import coremltools as ct
        import numpy as np

        model = ct.models.MLModel(str(artifact))
        return {k: np.asarray(v) for k, v in model.predict(dict(inputs)).items()}

    def open_stateful(self, artifact: Path):
        """Core ML's own state (``make_state()`` / ``predict(..., state=)``, macOS 15+); written for
        macOS, never run off it."""
        from edgebuild_coreml.runtime import generate_description

        description = generate_description(artifact)
        if description is None:
            return None
        return CoreMLState(artifact, description)


class CoreMLState:
    """A stateful Core ML model and its MLState, kept between predictions."""

    def __init__(self, artifact: Path, generate: dict):
        import coremltools as ct

        self.model = ct.models.MLModel(str(artifact))
        self.generate = generate
        self.state = self.model.make_state()

    def run(self, inputs: Mapping) -> dict:
        import numpy as np

        return {k: np.asarray(v) for k, v in self.model.predict(dict(inputs), state=self.state).items()}

    def reset(self) -> None:
        self.state = self.model.make_state()
