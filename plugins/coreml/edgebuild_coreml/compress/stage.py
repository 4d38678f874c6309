"""The Core ML backend's compress stage: gate by deployment target, then plain or automatic.

``calibration`` may be a list of input dicts or a callable ``(count or None) -> list`` giving
that many (None: as many as the validate section has), so a plain compression that needs no
inputs never generates them and auto mode generates only the samples it uses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Union

import numpy as np

from edgebuild.errors import RecipeError

from .config import AutoCompression, CompressionSection, KeepWeights, validate_compression
from .gating import check_deployment_target, ios_level, required_features

Samples = list[dict[str, np.ndarray]]
Calibration = Union[Samples, Callable[[int | None], Samples], None]


def compress_stage(src: Path, dst: Path, compression: dict, *, target: str, calibration: Calibration = None) -> dict:
    """Compress ``src`` into ``dst`` as the recipe's ``compression`` section says; the stage's info."""
    from .apply import compress_mlpackage

    section = compression if isinstance(compression, CompressionSection) else validate_compression(compression)
    check_deployment_target(section, target)
    if section.auto is None:
        samples = _materialise(calibration, None) if section.activations is not None else None
        return compress_mlpackage(src, dst, section, target=target, calibration=samples)

    from .auto import auto_compress

    check_auto_candidates(section.auto, target)
    return auto_compress(src, dst, section.auto, target=target, calibration=_materialise(calibration, section.auto.samples),
                         weight_threshold=section.weight_threshold)


def check_auto_candidates(auto: AutoCompression, target: str) -> None:
    """Raise RecipeError naming the first candidate ``target`` is too old for."""
    level = ios_level(target)
    for index, candidate in enumerate(auto.candidates):
        if isinstance(candidate, KeepWeights):
            continue
        for feature, needed in required_features(CompressionSection(weights=candidate)):
            if level < needed:
                raise RecipeError(
                    f"compression.auto.candidates[{index}]: {feature} needs iOS{needed}; the recipe targets {target}",
                    hint=f"raise target.deployment_target to iOS{needed} or drop that candidate",
                )


def compress_stage_params(compression: dict, deployment_target: str, validate: Mapping[str, Any] | None) -> dict:
    """The compress stage's cache-key parameters; auto mode and activation quantisation also
    depend on their calibration inputs."""
    params = {"compression": compression, "deployment_target": deployment_target}
    if compression and (compression.get("auto") is not None or compression.get("activations") is not None):
        validate = validate or {}
        params["calibration"] = {"samples": validate.get("samples"), "inputs": validate.get("inputs")}
    return params


def calibration_inputs(
    onnx_path: Path,
    recipe_inputs: Mapping[str, Any],
    validate_section,
    base_dir: Path,
    lowered_info: Mapping[str, Any] | None,
    samples: int | None = None,
) -> Samples:
    """Inputs from the recipe's validate section (uniform [0, 1) without one), keyed by MIL name.

    At most ``samples`` of them (None: the section's count; 4 without a section).

    Fixed-value inputs are folded into the model, so they are not fed.
    """
    from edgebuild.dag.validate import onnx_input_specs
    from edgebuild.verify.config import ValidateSection
    from edgebuild.verify.inputs import generate_inputs

    specs = {name: spec for name, spec in onnx_input_specs(onnx_path, dict(recipe_inputs)).items()
             if "value" not in spec}
    if validate_section is None:
        validate_section = ValidateSection(samples=samples or 4)
    if samples is not None:
        validate_section = validate_section.model_copy(update={"samples": min(validate_section.samples, samples)})
    renamed = (lowered_info or {}).get("renamed_inputs", {})
    return [{renamed.get(name, name): value for name, value in sample.items() if name in specs}
            for sample in generate_inputs(validate_section, specs, base_dir)]


def _materialise(calibration: Calibration, count: int | None) -> Samples | None:
    if callable(calibration):
        return calibration(count)
    return calibration if calibration is None or count is None else calibration[:count]
