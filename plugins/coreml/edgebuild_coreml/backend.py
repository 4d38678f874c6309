"""The Core ML backend: its stages (lower -> (compress) -> package, in :mod:`edgebuild_coreml.stages`), the
runners the core validates the package with, and the compute plan."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Mapping, Sequence

from edgebuild.plugin import Backend, Candidate, Skipped, Stage
from edgebuild_coreml.stages import ARTIFACT, stages_of

VALIDATION_RUNTIMES = ("interpreter", "coreml")  # validate.runtimes; "coreml" only runs on macOS


class CoreMLBackend(Backend):
    name = "coreml"
    artifact = ARTIFACT
    validation_runtimes = VALIDATION_RUNTIMES
    validation_inputs = ("lower",)  # its info names the inputs and outputs the package renamed
    validation_libraries = ("coremltools",)  # the interpreter reads the package with it
    default = True

    def conformance_runner(self):
        """ONNX conformance cases lowered at iOS18/fp32 and run in the MIL interpreter (imported on use)."""
        from edgebuild_coreml.conformance_runner import CoreMLConformanceRunner

        return CoreMLConformanceRunner()

    def lower_segment(self, model, directory: Path, *, params: dict, registry) -> dict:
        from edgebuild_coreml.segment import lower_segment

        return lower_segment(model, directory, params=params, registry=registry)

    def stages(self, variant, registry) -> list[Stage]:
        return stages_of(variant, registry)

    @staticmethod
    def check_recipe(recipe) -> None:
        """Checks at load (``edgebuild validate``): chip and rewrite names exist."""
        from edgebuild_coreml.compute import check_compute_names

        check_compute_names(recipe.compute)

    # -- validation (the core's validate stage calls these) ----------------------------------
    def candidates(self, artifact: Path, runtimes: Sequence[str], *, precision: str, emulate_fp16: bool,
                   built: Mapping[str, dict], registry) -> dict:
        """The MIL interpreter (several samples at once) and, on macOS, Core ML once per compute unit
        (one sample at a time: concurrent predictions were never measured); elsewhere "coreml" is skipped."""
        from edgebuild_coreml import coreml_runtime

        lowered = built.get("lower")
        found: dict = {}
        if "interpreter" in runtimes:
            found["interpreter"] = Candidate(self.runner(artifact, precision, emulate_fp16=emulate_fp16,
                                                         lowered=lowered))
        if "coreml" in runtimes:
            if coreml_runtime.available():
                found.update({name: Candidate(run, parallel=False)
                              for name, run in coreml_runtime.core_ml_runners(artifact, lowered).items()})
            else:
                found["coreml"] = Skipped(coreml_runtime.SKIPPED)
        return found

    def sessions(self, artifact: Path, runtimes: Sequence[str], *, registry) -> dict:
        """For a generative recipe: the package's InferenceSession in the interpreter and, on macOS, in Core ML."""
        from edgebuild.plugin.bundle import InferenceSession
        from edgebuild_coreml import coreml_runtime

        found: dict = {}
        if "interpreter" in runtimes:
            found["interpreter"] = functools.partial(InferenceSession, artifact, registry=registry, native=False)
        if "coreml" in runtimes:
            found["coreml"] = (functools.partial(InferenceSession, artifact, registry=registry)
                               if coreml_runtime.available() else Skipped(coreml_runtime.SKIPPED))
        return found

    def runner(self, artifact: Path, precision: str, *, emulate_fp16: bool = False, lowered: dict | None = None):
        """The interpreter on ``artifact``, fed and read by ONNX names.

        An fp16 artifact already computes in its own (typed) fp16, including the ops the guard
        kept in fp32; ``emulate_fp16`` also rounds those through fp16. ``lowered`` is the lower
        stage's info, for inputs and outputs whose ONNX names were not valid MIL names.
        """
        from edgebuild_coreml.interpreter.artifact_runner import ArtifactRunner

        return ArtifactRunner(artifact, emulate_fp16=emulate_fp16, lowered=lowered)

    # -- compute plan (``edgebuild plan``) ------------------------------------------------
    def compute_plan(self, variant, registry, *, output_of, chip: str | None = None) -> dict:
        """The per-op compute plan of the variant's lowered program: {"ops", "breakdown", "total_ms", ...}.

        Read-only: ``output_of("lower")`` gives the store's lowering, or makes it in a temporary directory.
        """
        from edgebuild_coreml.plan_source import lowered_program

        with lowered_program(variant, output_of, ARTIFACT) as lowered:
            return self._describe_plan(variant, lowered, chip)

    @staticmethod
    def _describe_plan(variant, lowered, chip: str | None) -> dict:
        from edgebuild_coreml import compute as policy
        from edgebuild_coreml.ane.plan import STRICT_POLICIES

        from edgebuild_coreml.levels import compute_at_level

        compute = compute_at_level(variant.recipe.compute, variant.recipe.optimize.level)  # as the lower stage's
        label = f"{variant.recipe.name}:{variant.name}"
        plan = policy.plan_for(lowered.program, compute, chip=chip, shapes_dynamic=lowered.shapes_dynamic)
        violations = plan.violations()
        warnings = [policy.range_fallback_warning(plan, label), policy.ane_absence_warning(plan, label)]
        data = plan.to_json()
        data.update(policy.per_shape_plans(lowered.program, compute, lowered.enumerated, chip=chip))
        data.update(policy.ane_layout_preview(lowered.program, compute, lowered.enumerated, chip=chip))
        data["policy"] = plan.policy
        if any(warnings):
            data["warnings"] = [w for w in warnings if w]
        if lowered.artifact is not None:
            from edgebuild_coreml.measured_plan import compare_with_core_ml

            units = policy.compute_units_for(compute.policy).name
            data["measured"] = compare_with_core_ml(lowered.artifact, data, units)
        if plan.policy in STRICT_POLICIES:
            data["violations"] = violations
        return data
