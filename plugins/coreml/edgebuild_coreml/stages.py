"""The Core ML backend's stages: lower -> (compress) -> package, declared from the validated recipe.

Each stage's parameters are a :class:`~edgebuild.plugin.StageParams` built once, here, by
:func:`stages_of`; each body is a function of this module that reads its parameters, its inputs'
results, the registry (the kinds its ``uses`` names) and the recipe's folder, nothing else. The
core validates the package (:meth:`CoreMLBackend.candidates` gives it the runners).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict

from edgebuild.plugin import Stage, StageInputs, StageParams, edgebuild_version
from edgebuild.plugin.recipe import Compute
from edgebuild.plugin.store import MLPACKAGE
from edgebuild.plugin.validation import ValidateSection, digest_params
from edgebuild_coreml.compress.config import CompressionSection
from edgebuild_coreml.levels import compute_at_level

ARTIFACT = "model.mlpackage"
ONNX_MODEL = "model.onnx"  # what the optimize stage writes

# coremltools' MIL builder keeps global state: with -j N, its stages take turns
SERIAL = {"exclusive": "coremltools"}
PACKAGE_FILES = {"layout": MLPACKAGE}  # what each stage writes; a remote entry holding more is refused

# The lower stage calls the registered lowerings (a third party's op among them); its own code is the
# plugin that registers Core ML's lowerings. sympy solves the reshapes' shapes.
LOWER_USES = ("lowerings",)
LOWER_LIBRARIES = ("coremltools", "onnx", "onnx-ir", "numpy", "sympy")
# compress and package call nothing registered: "backends" names the plugin whose code they are
BACKEND_USES = ("backends",)
COMPRESS_LIBRARIES = ("coremltools", "numpy", "scikit-learn")
CALIBRATION_LIBRARIES = ("onnx",)  # reading the source's input specs
PACKAGE_LIBRARIES = ("coremltools",)


def strictest_cosine_min(section: ValidateSection | None) -> float | None:
    """The highest cosine_min of ``section``'s thresholds and per-output overrides; None if it sets none."""
    if section is None:
        return None
    limits = [t.cosine_min for t in (section.thresholds, *(o.thresholds for o in section.per_output.values()))
              if t is not None and t.cosine_min is not None]
    return max(limits, default=None)


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GuardCalibration(_Part):
    """What the fp16 guard calibrates on: the validate section cut to what it reads (its inputs, and
    at most FP16_GUARD_SAMPLES samples: more samples change validation, not the lowered program)."""

    section: ValidateSection
    input_files: dict[str, str] = {}  # the files those inputs read -> sha256
    cosine_min: Optional[float] = None  # the recipe's strictest validate cosine_min: the precision to keep


class LowerParams(StageParams):
    deployment_target: str
    precision: str
    inputs: dict  # source.inputs, defaults applied
    compute: Compute  # the recipe's typed compute section (policy, chip, overrides, rewrites with the level's)
    generate: Optional[dict] = None  # a stateful decoder (lowering.stateful)
    calibration: Optional[GuardCalibration] = None  # the fp16 guard runs (float16 and compute.fp16_guard)


class CompressCalibration(_Part):
    """What auto mode and activation quantisation calibrate on: the validate section's inputs, or a
    generative recipe's prompts, fed as the lowered program takes them."""

    section: Optional[ValidateSection]  # cut to samples, inputs and generation; None: the recipe has none
    input_files: dict[str, str] = {}
    inputs: dict  # source.inputs, defaults applied (the specs the samples follow)
    generate: Optional[dict] = None  # a stateful decoder takes its prompts as token ids at a position


class CompressParams(StageParams):
    compression: CompressionSection  # validated and checked against the target at load
    calibration: Optional[CompressCalibration] = None


class PackageMetadata(_Part):
    """Written into the package's description (the only reason each field is in the key)."""

    recipe: str
    variant: str
    compute_policy: str
    author: Optional[str] = None
    license: Optional[str] = None
    description: Optional[str] = None
    version: Optional[str] = None
    versions: dict[str, str]  # edgebuild and the backend's plugin


class PackageParams(StageParams):
    packaged: str  # the stage whose package this one completes (compress, else lower)
    metadata: PackageMetadata


# -- declaring ----------------------------------------------------------------------------------

def stages_of(variant, registry) -> list[Stage]:
    """lower, (compress), package of ``variant``: their parameters from its validated recipe."""
    recipe = variant.recipe
    stages = [Stage("lower", lower_params_of(variant), ["optimize"], lower_stage, uses=LOWER_USES,
                    libraries=LOWER_LIBRARIES, extra={**SERIAL, **PACKAGE_FILES})]
    last = "lower"
    compression = variant.section("coreml:compression")
    if compression is not None:
        params = compress_params_of(compression, recipe.validate_, variant.base_dir, variant.params["source"]["inputs"],
                                    variant.params.get("generate"))
        calibrating = params.calibration is not None
        stages.append(Stage("compress", params, ["lower", "optimize"] if calibrating else ["lower"], compress_stage,
                            uses=BACKEND_USES,
                            libraries=COMPRESS_LIBRARIES + (CALIBRATION_LIBRARIES if calibrating else ()),
                            extra={**SERIAL, **PACKAGE_FILES}))
        last = "compress"
    backend = registry.plugin_of("backends", recipe.target.backend) if registry is not None else None
    metadata = PackageMetadata(
        recipe=recipe.name, variant=variant.name, compute_policy=recipe.compute.policy,
        author=recipe.metadata.author, license=recipe.metadata.license, description=recipe.metadata.description,
        version=recipe.metadata.version,
        versions={"edgebuild": edgebuild_version(),
                  **({backend.distribution or backend.name: backend.version} if backend else {})})
    stages.append(Stage("package", PackageParams(packaged=last, metadata=metadata), [last, "resolve"], package_stage,
                        uses=BACKEND_USES, libraries=PACKAGE_LIBRARIES,
                        extra={"artifact": ARTIFACT, **SERIAL, **PACKAGE_FILES}))
    return stages


def lower_params_of(variant) -> LowerParams:
    recipe = variant.recipe
    calibration = None
    if recipe.target.precision == "float16" and recipe.compute.fp16_guard:
        from edgebuild_coreml.compute import FP16_GUARD_SAMPLES

        section = recipe.validate_
        samples = min(section.samples, FP16_GUARD_SAMPLES) if section is not None else FP16_GUARD_SAMPLES
        # a detector's outputs are judged as validation judges them: matched boxes, the box limits
        detections = ({"detections": section.detections, "thresholds": section.thresholds,
                       "per_output": section.per_output} if section is not None and section.detections else {})
        calibration = GuardCalibration(
            section=ValidateSection(samples=samples, inputs=section.inputs if section is not None else {},
                                    **detections),
            cosine_min=strictest_cosine_min(section), **digest_params(section, variant.base_dir))
    return LowerParams(deployment_target=recipe.target.deployment_target, precision=recipe.target.precision,
                       inputs=variant.params["source"]["inputs"],
                       compute=compute_at_level(recipe.compute, recipe.optimize.level),
                       generate=variant.params.get("generate"), calibration=calibration)


def compress_params_of(compression: CompressionSection, validate: ValidateSection | None, base_dir: Path,
                       inputs: dict, generate: dict | None) -> CompressParams:
    """Plain compression reads only its section; auto mode and activation quantisation also their
    calibration inputs."""
    if compression.auto is None and compression.activations is None:
        return CompressParams(compression=compression)
    section = None
    if validate is not None:
        section = ValidateSection(samples=validate.samples, inputs=validate.inputs, generation=validate.generation)
    return CompressParams(compression=compression, calibration=CompressCalibration(
        section=section, inputs=inputs, generate=generate, **digest_params(validate, base_dir)))


# -- bodies -------------------------------------------------------------------------------------

def lower_stage(params: LowerParams, inputs: StageInputs, out: Path) -> dict:
    from edgebuild_coreml.lower import lower_model

    return lower_model(inputs.path("optimize") / ONNX_MODEL, out / ARTIFACT, params, inputs.registry,
                       base_dir=inputs.base_dir)


def compress_stage(params: CompressParams, inputs: StageInputs, out: Path) -> dict:
    from edgebuild_coreml.compress.stage import calibration_inputs, compress_stage as compress

    calibration, source = params.calibration, None
    if calibration is not None:
        model, lowered = inputs.path("optimize") / ONNX_MODEL, inputs.info("lower")

        def samples(count):
            return calibration_inputs(model, calibration.inputs, calibration.section, inputs.base_dir, lowered, count,
                                      generate=calibration.generate)

        generation = calibration.section is not None and calibration.section.generation is not None
        source = "validate.generation.prompts" if generation else "validate.inputs"
    return compress(inputs.path("lower") / ARTIFACT, out / ARTIFACT, params.compression,
                    calibration=samples if calibration is not None else None, calibration_source=source)


def package_stage(params: PackageParams, inputs: StageInputs, out: Path) -> dict:
    from edgebuild_coreml.lowering.package import write_package

    return write_package(inputs.path(params.packaged) / ARTIFACT, out / ARTIFACT,
                         params.metadata.model_dump(mode="json"), source_sha256=inputs.info("resolve")["sha256"])
