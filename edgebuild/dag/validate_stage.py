"""The validate stage, declared by the core for every backend's artifact.

Its parameters are the recipe's validate section with the source's format, inputs and options;
its body measures the reference the source's format calls for
(:func:`edgebuild.verify.reference.choose_reference`) against each candidate the backend offers
(:meth:`edgebuild.protocols.Backend.candidates`), or for a generative recipe greedy generation with
the backend's sessions. The limits (``validate.thresholds``, ``validate.per_output``) only judge:
they are not in the key, and :func:`judge_validation` holds each variant's measurements to its own
(:mod:`edgebuild.dag.verdict`), so a threshold edit reruns nothing. Declaring it imports nothing
numeric: a fully cached run stays light.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any, ClassVar, Mapping

from edgebuild.protocols import Skipped
from edgebuild.recipe.formats import source_format
from edgebuild.recipe.validation import ValidateSection
from edgebuild.stage import Stage, StageInputs, StageParams
from edgebuild.store.layout import VALIDATION

VALIDATE_LIBRARIES = ("onnxruntime", "onnx", "numpy")  # the reference, its loader and the metrics


class ValidateParams(StageParams):
    backend: str
    artifact_stage: str  # the stage whose output holds the artifact
    artifact: str  # its name there
    validate_section: ValidateSection  # the recipe's validate: (its name is what `plan` says changed)
    input_files: dict[str, str] = {}  # validation input files -> sha256
    format: str  # the source's frontend
    inputs: dict  # source.inputs, defaults applied
    options: Any = None  # the frontend's typed source.options
    precision: str
    runtimes: tuple[str, ...]
    platform: str | None = None  # set when a native runtime is asked for: which ran depends on the OS
    generate: dict | None = None  # a generative recipe's generate section: validated by generation

    # the fields that only judge what the body measured (see judge_validation): left out of the key
    judging: ClassVar[tuple[str, ...]] = ("validate_section.thresholds", "validate_section.per_output")

    def key_params(self) -> dict:
        """Every field but the limits, which the body never reads."""
        params = super().key_params()
        left_out = {name.partition(".")[2] for name in self.judging}
        params["validate_section"] = {k: v for k, v in params["validate_section"].items() if k not in left_out}
        return params


def validate_stage_of(variant, registry, backend, frontend, stages: list) -> Stage | None:
    """The validate stage of a variant whose recipe asks for validation, or None when no runtime is to
    run (the backend validates none by default and the recipe names none)."""
    from edgebuild.verify.files import digest_params

    section = variant.recipe.validate_
    runtimes = tuple(section.runtimes or (backend.validation_runtimes if backend.default_runtimes is None
                                          else backend.default_runtimes))
    if not runtimes:
        return None
    producer = next(stage for stage in reversed(stages) if "artifact" in stage.extra)
    native = any(getattr(registry.get("runtimes", name), "native", False) for name in runtimes)
    params = ValidateParams(
        backend=variant.recipe.target.backend, artifact_stage=producer.name, artifact=producer.extra["artifact"],
        validate_section=section, input_files=digest_params(section, variant.base_dir).get("input_files", {}),
        format=source_format(variant.recipe.source), inputs=variant.params["source"]["inputs"],
        options=variant.section(f"{source_format(variant.recipe.source)}:source.options"),
        precision=variant.recipe.target.precision, runtimes=runtimes,
        platform=platform.system() if native else None, generate=generate_section(variant))
    extra = {"layout": VALIDATION}
    if "exclusive" in producer.extra:  # the backend's library, with its global state, in turns here too
        extra["exclusive"] = producer.extra["exclusive"]
    return Stage("validate", params, [producer.name, "resolve", *backend.validation_inputs], validate_stage,
                 uses=("backends", "runtimes", "frontends", "custom_ops"),
                 libraries=(*VALIDATE_LIBRARIES, *backend.validation_libraries, *frontend.libraries), extra=extra,
                 judge=judge_validation)


def validate_stage(params: ValidateParams, inputs: StageInputs, out: Path) -> dict:
    """The artifact against the source, each candidate runtime the backend offers on the same samples:
    measured, not judged (see :func:`judge_validation`)."""
    from edgebuild.dag.validate import draw_samples, generator_of, measure, measure_generation, merge_runtime, save

    registry = inputs.registry
    section = params.validate_section
    artifact, source = _artifact(params, inputs), inputs.path("resolve")
    if params.generate is not None:  # a stateful decoder: validated by generation
        sessions = registry.get("backends", params.backend).sessions(artifact, params.runtimes, registry=registry)
        opened = {name: s for name, s in sessions.items() if not isinstance(s, Skipped)}
        record = measure_generation(section, params.generate, inputs.base_dir, opened,
                                    generator_of(registry, params.format, params.options, inputs.base_dir,
                                                 source, params.generate))
        _record_skipped(record, sessions)
        return save(out, record)
    reference = _reference(params, inputs)
    if reference.runner is None:  # validate.reference: none
        return save(out, {"samples": 0, "reference": "none", "runtimes": {},
                          "not_validated": "validate.reference: none",
                          "warnings": list(reference.warnings)})
    candidates = _candidates(params, inputs)
    drawn = None
    record: dict = {"samples": 0, "reference": reference.name, "runtimes": {}}
    for name, candidate in candidates.items():
        if isinstance(candidate, Skipped):
            continue
        drawn = drawn or draw_samples(section, source, params.inputs, inputs.base_dir, specs=reference.specs,
                                      reference=reference.runner)
        merge_runtime(record, measure(section, drawn, candidate.runner, name, reference_name=reference.name,
                                      parallel=candidate.parallel))
    _record_skipped(record, candidates)
    if reference.warnings:
        record["warnings"] = list(reference.warnings)
    return save(out, record)


def judge_validation(params: ValidateParams, measured: dict, inputs: StageInputs) -> dict:
    """The stage's record (ran or cached) judged by this variant's limits: the report's ``validation``.
    A failed distance limit is checked against float64 on its worst sample, which runs the reference
    and the candidate once more (only then are they loaded)."""
    from edgebuild.dag.verdict import judge
    from edgebuild.report.write import to_jsonable

    def diagnose(runtime: str, failures: list, per_sample: list) -> dict | None:
        from edgebuild.dag.validate import draw_samples, float64_diagnosis

        reference = _reference(params, inputs)
        candidate = _candidates(params, inputs)[runtime]
        drawn = draw_samples(params.validate_section, inputs.path("resolve"), params.inputs, inputs.base_dir,
                             specs=reference.specs, reference=reference.runner)
        return float64_diagnosis(drawn, reference.name, candidate.runner, failures, per_sample)

    return to_jsonable(with_stage_notes(judge(measured, params.validate_section, diagnose=diagnose), inputs))


def with_stage_notes(record: dict, inputs: StageInputs) -> dict:
    """``record`` with each failure's message followed by the ``validation_note`` an upstream stage's info
    holds: what a build stage saw coming (the fp16 guard's "ill-conditioned in fp16", say)."""
    notes = [note for result in inputs.results.values()
             if isinstance(getattr(result, "info", None), dict) and (note := result.info.get("validation_note"))]
    if not notes:
        return record
    failures = [*record.get("failures", []),
                *(f for one in (record.get("runtimes") or {}).values() for f in one.get("failures", []))]
    for failure in failures:
        if isinstance(failure, dict) and failure.get("message"):
            failure["message"] += "; " + "; ".join(notes)
    return record


def _artifact(params: ValidateParams, inputs: StageInputs) -> Path:
    # the artifact stage may report what it actually made (a bundle that is one whole package)
    return inputs.path(params.artifact_stage) / inputs.info(params.artifact_stage).get("artifact", params.artifact)


def _reference(params: ValidateParams, inputs: StageInputs):
    from edgebuild.verify.reference import choose_reference

    return choose_reference(inputs.path("resolve"), inputs.registry, fmt=params.format, inputs=params.inputs,
                            options=params.options, base_dir=inputs.base_dir, section=params.validate_section)


def _candidates(params: ValidateParams, inputs: StageInputs) -> dict:
    backend = inputs.registry.get("backends", params.backend)
    built = {name: inputs.info(name) for name in backend.validation_inputs}
    return backend.candidates(_artifact(params, inputs), params.runtimes, precision=params.precision,
                              emulate_fp16=params.validate_section.fp16_emulation == "on", built=built,
                              registry=inputs.registry)


def _record_skipped(record: dict, offered: Mapping) -> None:
    for name, candidate in offered.items():
        if isinstance(candidate, Skipped):
            record["runtimes"][name] = {"skipped": candidate.reason}


def generate_section(variant) -> dict | None:
    """The recipe's ``generate:`` section as a dict, or None for a recipe that does not generate."""
    section = getattr(variant.recipe, "generate", None)
    if section is None:
        section = (getattr(variant, "data", None) or {}).get("generate")
    if hasattr(section, "model_dump"):
        section = section.model_dump(mode="json")
    return section or None
