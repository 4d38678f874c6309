"""The Core ML backend: lower -> (compress) -> package -> validate stages of a variant."""

from __future__ import annotations

import gc
import platform
import shutil
from contextlib import contextmanager
from pathlib import Path

from edgebuild.dag.stages import Stage
from edgebuild.versions import edgebuild_version
from edgebuild.errors import BuildError
from edgebuild.protocols import Backend
from edgebuild.store.layout import MLPACKAGE, VALIDATION
from edgebuild.verify.files import digest_params

ARTIFACT = "model.mlpackage"
VALIDATION_RUNTIMES = ("interpreter", "coreml")  # validate.runtimes; "coreml" only runs on macOS


def _load_onnx(path: Path):
    from edgebuild.graph.weight_files import load_stage_model

    return load_stage_model(path)  # the optimise stage's data file may link the import stage's


class CoreMLBackend(Backend):
    name = "coreml"
    artifact = ARTIFACT
    validation_runtimes = VALIDATION_RUNTIMES
    default = True

    def conformance_runner(self):
        """ONNX conformance cases lowered at iOS18/fp32 and run in the MIL interpreter (imported on use)."""
        from edgebuild_coreml.conformance_runner import CoreMLConformanceRunner

        return CoreMLConformanceRunner()

    def lower_segment(self, model, directory: Path, *, params: dict, registry) -> dict:
        from edgebuild_coreml.segment import lower_segment

        return lower_segment(model, directory, params=params, registry=registry)

    def stages(self, variant, registry, plugins: dict[str, str]) -> list[Stage]:
        recipe = variant.recipe
        target = recipe.target
        params = variant.params
        lower_params = self.lower_params(variant)

        # coremltools' MIL builder keeps global state: with -j N, its stages take turns
        serial = {"exclusive": "coremltools"}
        package_files = {"layout": MLPACKAGE}  # what each stage writes; a remote entry holding more is refused
        stages = [Stage("lower", lower_params, ["optimize"], plugins, produce=self.lower_stage_body(variant, registry),
                        extra={**serial, **package_files})]
        last = "lower"
        compression = variant.section("coreml:compression")  # validated and checked against the target at load
        if compression is not None:
            from edgebuild_coreml.compress.stage import compress_stage_params

            compress_params = compress_stage_params(params["compression"], target.deployment_target, params["validate"])
            if "calibration" in compress_params:
                compress_params["calibration"].update(digest_params(recipe.validate_, variant.base_dir))

            def compress(results, out: Path) -> dict:
                from edgebuild_coreml.compress.stage import (
                    calibration_inputs,
                    compress_stage,
                )

                calibration = compress_params.get("calibration", {})
                return compress_stage(
                    results["lower"].path / ARTIFACT, out / ARTIFACT, compression,
                    calibration=lambda count: calibration_inputs(
                        results["optimize"].path / "model.onnx", params["source"]["inputs"], recipe.validate_,
                        variant.base_dir, results["lower"].info, count, generate=lower_params.get("generate")),
                    calibration_source="validate.generation.prompts" if "generation" in calibration
                    else "validate.inputs")

            deps = ["lower", "optimize"] if "calibration" in compress_params else ["lower"]
            stages.append(Stage("compress", compress_params, deps, plugins, produce=compress,
                                extra={**serial, **package_files}))
            last = "compress"
        metadata = {
            "recipe": recipe.name, "variant": variant.name, "compute_policy": recipe.compute.policy,
            "author": recipe.metadata.author, "license": recipe.metadata.license,
            "description": recipe.metadata.description, "version": recipe.metadata.version,
            "versions": {"edgebuild": edgebuild_version(), **plugins},
        }

        def package(results, out: Path) -> dict:
            return self.package(results[last].path / ARTIFACT, out / ARTIFACT,
                                dict(metadata, source_sha256=results["resolve"].info["sha256"]))

        stages.append(Stage("package", {"metadata": metadata}, [last, "resolve"], plugins, produce=package,
                            extra={"artifact": ARTIFACT, **serial, **package_files}))
        if recipe.validate_ is not None:
            section = recipe.validate_
            runtimes = section.runtimes or self.validation_runtimes

            def validate(results, out: Path) -> dict:
                from edgebuild.dag.validate import generate_section, merge_runtime, reference_for, save
                from edgebuild.dag.validate import validate as run_validation
                from edgebuild_coreml import coreml_runtime

                artifact, lowered = results["package"].path / ARTIFACT, results["lower"].info
                if generate_section(variant) is not None:  # a stateful decoder: validated by generation
                    return save(out, self.validate_generation(variant, registry, artifact, results["resolve"].path,
                                                              runtimes))
                reference, specs, name = reference_for(registry, variant, results["resolve"].path)
                candidates = {}
                if "interpreter" in runtimes:
                    candidates["interpreter"] = self.runner(artifact, target.precision, lowered=lowered,
                                                            emulate_fp16=section.fp16_emulation == "on")
                if "coreml" in runtimes:
                    candidates.update(coreml_runtime.core_ml_runners(artifact, lowered))
                record = {"samples": 0, "reference": name, "runtimes": {}, "failures": []}
                for runtime, runner in candidates.items():
                    one = run_validation(section, results["resolve"].path, params["source"]["inputs"], runner,
                                         variant.base_dir, candidate_name=runtime, reference=reference,
                                         specs=specs, reference_name=name, parallel=runtime == "interpreter")
                    merge_runtime(record, one)
                if "coreml" in runtimes and not coreml_runtime.available():
                    record["runtimes"]["coreml"] = {"skipped": coreml_runtime.SKIPPED}
                return save(out, record)

            validate_params = {"validate": params["validate"], **digest_params(section, variant.base_dir)}
            if "coreml" in runtimes:  # which candidates ran depends on the OS
                validate_params["platform"] = platform.system()
            stages.append(Stage("validate", validate_params, ["package", "resolve", "lower"], plugins, produce=validate,
                                extra={**serial, "layout": VALIDATION}))
        return stages

    @staticmethod
    def validate_generation(variant, registry, artifact: Path, source: Path, runtimes) -> dict:
        """Greedy generation of the artifact, in each runtime of ``runtimes`` this machine has, against the source's."""
        from edgebuild.bundle.session import InferenceSession
        from edgebuild.dag.validate import validate_generation
        from edgebuild_coreml import coreml_runtime

        sessions = {}
        if "interpreter" in runtimes:
            sessions["interpreter"] = lambda: InferenceSession(artifact, registry=registry, native=False)
        if "coreml" in runtimes and coreml_runtime.available():
            sessions["coreml"] = lambda: InferenceSession(artifact, registry=registry)
        record = validate_generation(variant, registry, source, sessions)
        if "coreml" in runtimes and not coreml_runtime.available():
            record["runtimes"]["coreml"] = {"skipped": coreml_runtime.SKIPPED}
        return record

    @staticmethod
    def check_recipe(recipe) -> None:
        """Checks at load (``edgebuild validate``): chip and rewrite names exist."""
        from edgebuild_coreml.compute import check_compute_names

        check_compute_names(recipe.compute)

    @staticmethod
    def lower_params(variant) -> dict:
        recipe = variant.recipe
        recipe_params = variant.params
        params = {
            "deployment_target": recipe.target.deployment_target,
            "precision": recipe.target.precision,
            "inputs": recipe_params["source"]["inputs"],
            "options": recipe_params["target"]["options"],
            "compute": recipe_params["compute"],
        }
        if recipe_params.get("generate") is not None:  # a stateful decoder (lowering.stateful)
            params["generate"] = recipe_params["generate"]
        if recipe.target.precision == "float16" and recipe.compute.fp16_guard:
            # The guard calibrates on (at most FP16_GUARD_SAMPLES of) the validation inputs, so they
            # shape the lowered program; more samples for validation do not.
            from edgebuild_coreml.compute import FP16_GUARD_SAMPLES

            section = recipe_params["validate"] or {}
            samples = section.get("samples")
            params["calibration"] = {"samples": min(samples, FP16_GUARD_SAMPLES) if samples else samples,
                                     "inputs": section.get("inputs"),
                                     **digest_params(recipe.validate_, variant.base_dir)}
        return params

    def lower_stage_body(self, variant, registry):
        """``produce`` of the lower stage: results + output dir -> stage info."""
        params = self.lower_params(variant)

        def lower(results, out: Path) -> dict:
            return self.lower(results["optimize"].path / "model.onnx", out / ARTIFACT, params, registry,
                              validate_section=variant.recipe.validate_, base_dir=variant.base_dir,
                              where=f"{variant.path.name} ({variant.name})")

        return lower

    # -- stage bodies ---------------------------------------------------------------------
    def lower(self, model_path: Path, artifact: Path, params: dict, registry, *,
              validate_section=None, base_dir: Path | None = None, where: str | None = None,
              passes: str = "lowering") -> dict:
        """ONNX -> MIL, ANE rewrites, fp16 guard, save; then plan it and enforce strict policies.

        One lowering, one pass pipeline: the fp16 guard runs inside it (just before the fp16 cast
        pass), and the plan reads the program coremltools saved, not a reload of the package.
        ``passes``: the pass list (``lowering.passes``); ``"default"`` is coremltools' own, for
        comparisons.
        """
        from edgebuild_coreml.lowering.reshape_shapes import solving_reshapes_directly

        _import_lowering_libraries()  # before the freeze, so the collections below skip them
        with _collections_skip_loaded_libraries(), solving_reshapes_directly():
            try:
                return self._lower(model_path, artifact, params, registry, validate_section=validate_section,
                                   base_dir=base_dir, where=where, passes=passes)
            finally:
                # The saved program (its fp16 weights) is cyclic: without a collection it outlives the
                # stage and sits under the next one's peak (the compress stage's, say).
                gc.collect()

    def _lower(self, model_path: Path, artifact: Path, params: dict, registry, *, validate_section, base_dir,
               where, passes) -> dict:
        from edgebuild_coreml import compute as policy
        from edgebuild_coreml.lowering.converter import convert
        from edgebuild_coreml.lowering.names import renamings
        from edgebuild_coreml.lowering.package import save_mlpackage
        from edgebuild_coreml.memory import map_large_blocks

        map_large_blocks()
        compute = params["compute"]
        imported = model_path.parent / ARTIFACT if (model_path.parent / ARTIFACT).exists() else None
        if imported is not None:
            result = _from_mlpackage(imported)
        else:
            result = convert(_load_onnx(model_path), target=params["deployment_target"],
                             precision=params["precision"], registry=registry, generate=params.get("generate"))
        gc.collect()  # the (cyclic) ONNX graph, before coremltools' passes add their own copies
        rewrites = policy.apply_enabled_rewrites(result.program, compute.get("rewrites") or {})
        info: dict = {}
        guard_run: dict = {}
        before_fp16_cast = None
        if "calibration" in params:
            from edgebuild_coreml.fp16_guard import saturate_infinite_constants

            saturated = saturate_infinite_constants(result.program)
            stateful = result.stateful
            before_fp16_cast = self._fp16_guard(guard_run, model_path, params["inputs"], result.input_names,
                                                validate_section, base_dir or model_path.parent,
                                                samples=stateful.calibration_samples if stateful else None)
        units = policy.compute_units_for(compute["policy"])
        model = save_mlpackage(result, artifact, target=params["deployment_target"], precision=params["precision"],
                               input_specs=policy.shape_specs(params["inputs"]), compute_units=units,
                               metadata={policy.COMPUTE_UNITS_KEY: units.name},
                               before_fp16_cast=before_fp16_cast, consume=True, passes=passes)
        # The passes consumed the lowered program; the saved one is the model's. Pymil graphs are
        # cyclic (ops <-> vars), so what the passes dropped goes only when the collector runs.
        result.program = None
        program = _saved_program(model, artifact)
        del model
        gc.collect()  # also removes coremltools' temporary package, whose weight file links ours
        hashing = _hash_in_background(artifact)  # the store's scan of the output then reads nothing
        keep_fp32: set[str] = set()
        if "calibration" in params:
            guard = guard_run.get("result")
            if guard is None:
                raise BuildError(f"{artifact.name}: coremltools' pipeline ran no fp16 cast pass, so the fp16 "
                                 "guard measured nothing", hint="set compute.fp16_guard: false")
            info["fp16_guard"] = {**guard.to_json(), "saturated_constants": saturated}
            keep_fp32 = guard.keep_fp32
        if keep_fp32:
            self._check_kept_fp32(program, keep_fp32, artifact.name)
        renamed_inputs = {k: v for k, v in result.input_names.items() if k != v}
        plan = policy.plan_for(program, compute,
                               shapes_dynamic=policy.range_inputs(params["inputs"], result.input_names))
        error = policy.violation_error(plan, where or model_path.name)
        if error is not None:
            error.program, error.renamed_inputs = program, renamed_inputs
            raise error
        if result.notes:
            info["notes"] = result.notes
        warnings = [policy.range_fallback_warning(plan, where or model_path.name),
                    policy.ane_absence_warning(plan, where or model_path.name)]
        if any(warnings):
            info["warnings"] = [w for w in warnings if w]
        plan_json = {**plan.to_json(), **policy.per_shape_plans(
            program, compute, policy.shape_choices(params["inputs"], result.input_names, params.get("generate")))}
        hashing.join()
        return {
            "op_counts": result.op_counts,
            "renamed_inputs": renamed_inputs,
            "renamed_outputs": {k: v for k, v in result.output_names.items() if k != v},
            "renamings": renamings(result.input_names, result.output_names),
            "compute_units": units.name,
            "rewrites": rewrites,
            "plan": plan_json,
            **info,
        }

    @staticmethod
    def _fp16_guard(record: dict, model_path: Path, recipe_inputs: dict, input_names: dict, validate_section,
                    base_dir: Path, samples=None):
        """The ``before_fp16_cast`` hook: runs the program, still fp32 after coremltools' passes, on
        calibration inputs and names the ops to keep in fp32 (its GuardResult goes to ``record``).
        ``samples()``: the calibration inputs when the recipe's do not fit the program (a stateful
        decoder takes token ids and a position)."""
        from edgebuild_coreml import fp16_guard
        from edgebuild_coreml.memory import return_freed_memory

        def before_fp16_cast(program) -> set[str]:
            # Inputs made one at a time as the guard runs them (a few MB each for an image model).
            calibration = samples() if samples is not None else fp16_guard.calibration_samples(
                validate_section, model_path, recipe_inputs, base_dir, input_names)
            record["result"] = guard = fp16_guard.find_overflows(program, calibration)
            return_freed_memory()  # the activations, before the cast pass copies constants
            return guard.keep_fp32

        return before_fp16_cast

    @staticmethod
    def _check_kept_fp32(program, keep_fp32: set[str], artifact_name: str) -> None:
        from edgebuild.errors import BuildError
        from edgebuild_coreml.fp16_guard import ops_not_fp32

        wrong = ops_not_fp32(program, sorted(keep_fp32))
        if wrong:
            raise BuildError(
                f"{artifact_name}: the fp16 guard asked to keep {', '.join(wrong)} in fp32, but the saved "
                "program computes them in fp16 (or renamed them), so they would overflow",
                hint="set target.precision: float32, or compute.fp16_guard: false to accept the overflow",
            )

    def package(self, src: Path, dst: Path, metadata: dict) -> dict:
        import coremltools as ct
        from coremltools.models.model import _get_model_spec_path

        from edgebuild_coreml.lowering.package import link_weight_files

        # The package is the lowered one with more metadata: its weight files (gigabytes for a
        # decoder) are hard links to the stage before's, only the spec is written anew.
        spec = ct.utils.load_spec(str(src))
        meta = spec.description.metadata
        meta.author = metadata.get("author") or meta.author
        meta.license = metadata.get("license") or meta.license
        meta.shortDescription = metadata.get("description") or meta.shortDescription
        if metadata.get("version"):
            meta.versionString = metadata["version"]
        user = meta.userDefined
        user["com.edgebuild.source_sha256"] = metadata["source_sha256"]
        user["com.edgebuild.recipe"] = metadata["recipe"]
        user["com.edgebuild.variant"] = metadata["variant"]
        user["com.edgebuild.compute_policy"] = metadata["compute_policy"]
        for name, version in metadata["versions"].items():
            user[f"com.edgebuild.version.{name}"] = version
        shutil.copytree(src, dst, copy_function=link_weight_files)
        spec_path = Path(_get_model_spec_path(str(dst)))
        spec_path.unlink()
        spec_path.write_bytes(spec.SerializeToString())
        return {"size_bytes": sum(f.stat().st_size for f in dst.rglob("*") if f.is_file())}

    def runner(self, artifact: Path, precision: str, *, emulate_fp16: bool = False, lowered: dict | None = None):
        """The interpreter on ``artifact``, fed and read by ONNX names.

        An fp16 artifact already computes in its own (typed) fp16, including the ops the guard
        kept in fp32; ``emulate_fp16`` also rounds those through fp16. ``lowered`` is the lower
        stage's info, for inputs and outputs whose ONNX names were not valid MIL names.
        """
        from edgebuild_coreml.interpreter.artifact_runner import ArtifactRunner

        return ArtifactRunner(artifact, emulate_fp16=emulate_fp16, lowered=lowered)

    # -- compute plan (``edgebuild plan``) ------------------------------------------------
    def compute_plan(self, build, store, registry, *, chip: str | None = None) -> dict:
        """The per-op compute plan of the variant's lowered program: {"ops", "breakdown", "total_ms", ...}.

        Read-only: a lowering the store lacks is made in a temporary directory and dropped.
        """
        from edgebuild_coreml.plan_source import lowered_program

        with lowered_program(build, store, ARTIFACT) as lowered:
            return self._describe_plan(build, lowered, chip)

    @staticmethod
    def _describe_plan(build, lowered, chip: str | None) -> dict:
        from edgebuild_coreml import compute as policy
        from edgebuild_coreml.ane.plan import STRICT_POLICIES

        compute = build.variant.params["compute"]
        plan = policy.plan_for(lowered.program, compute, chip=chip, shapes_dynamic=lowered.shapes_dynamic)
        violations = plan.violations()
        warnings = [policy.range_fallback_warning(plan, build.job.label),
                    policy.ane_absence_warning(plan, build.job.label)]
        data = plan.to_json()
        data.update(policy.per_shape_plans(lowered.program, compute, lowered.enumerated, chip=chip))
        data.update(policy.ane_layout_preview(lowered.program, compute, lowered.enumerated, chip=chip))
        data["policy"] = plan.policy
        if any(warnings):
            data["warnings"] = [w for w in warnings if w]
        if lowered.artifact is not None:
            from edgebuild_coreml.measured_plan import compare_with_core_ml

            units = policy.compute_units_for(compute["policy"]).name
            data["measured"] = compare_with_core_ml(lowered.artifact, data, units)
        if plan.policy in STRICT_POLICIES:
            data["violations"] = violations
        return data


def _import_lowering_libraries() -> None:
    """Import what the lower stage runs (coremltools, sympy, scipy; torch too where a process has it:
    millions of objects) before :func:`_collections_skip_loaded_libraries` freezes what is loaded.
    Imported inside the stage instead, they would stay unfrozen, and each of the stage's garbage
    collections would walk them all (about 40% of a conv net's lower stage in a fresh process)."""
    import edgebuild_coreml.lowering.converter  # noqa: F401
    import edgebuild_coreml.lowering.package  # noqa: F401


@contextmanager
def _collections_skip_loaded_libraries():
    """Keep the objects alive when the stage starts (torch, coremltools, onnx: hundreds of thousands)
    out of the stage's garbage collections, which then only walk what the stage made.

    Pymil graphs are cyclic, so the stage collects several times (coremltools once more inside
    ``ct.convert``); each full collection over the libraries costs about a second. The objects go
    back to the collector when the last scope open ends (``edgebuild.collections_scope``: the
    executor opens one around every stage body, before this stage's own imports).
    """
    from edgebuild.collections_scope import older_objects_frozen

    with older_objects_frozen():
        yield


def _hash_in_background(artifact: Path):
    """A started thread hashing the package's weight files (gigabytes for a decoder) on the other
    core while the plan is made; what it hashed is remembered (edgebuild.store.hashstate)."""
    import threading

    from edgebuild.store.hashstate import hashed_once

    def run() -> None:
        for path in sorted((artifact / "Data").rglob("weights/*")):
            try:
                hashed_once(path)
            except OSError:
                pass  # the store's scan hashes it then

    thread = threading.Thread(target=run, name="edgebuild-hash-weights", daemon=True)
    thread.start()
    return thread


def _saved_program(model, artifact: Path):
    """The pymil program coremltools just serialized into ``artifact``, else the package read back."""
    program = getattr(model, "_mil_program", None)
    if program is not None:
        return program
    from edgebuild_coreml.interpreter import load_mlpackage

    return load_mlpackage(artifact)


def _from_mlpackage(path: Path):
    """A package a frontend converted itself (PyTorch through coremltools), re-lowered at the recipe's
    precision and target like any other program."""
    import coremltools as ct
    from coremltools.converters.mil.frontend.milproto.load import load as load_milproto

    from edgebuild_coreml.lowering.converter import ConvertResult

    spec = ct.utils.load_spec(str(path))
    program = load_milproto(spec, spec.specificationVersion, str(path / "Data" / "com.apple.CoreML" / "weights"))
    names = {i.name: i.name for i in spec.description.input}
    return ConvertResult(program=program, input_names=names,
                         output_names={o.name: o.name for o in spec.description.output})


def on_macos() -> bool:
    return platform.system() == "Darwin"
