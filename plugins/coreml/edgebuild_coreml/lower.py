"""The lower stage's work: ONNX -> MIL, ANE rewrites, fp16 guard, save; then plan it and enforce strict policies.

One lowering, one pass pipeline: the fp16 guard runs inside it (just before the fp16 cast pass),
and the plan reads the program coremltools saved, not a reload of the package.
"""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from pathlib import Path

from edgebuild.plugin import BuildError, older_objects_frozen
from edgebuild_coreml.stages import ARTIFACT, LowerParams

LABEL = "model.onnx"  # what warnings and errors name: the run prints the variant beside them


def lower_model(model_path: Path, artifact: Path, params: LowerParams, registry, *, base_dir: Path | None = None,
                passes: str = "lowering") -> dict:
    """``model_path`` lowered into the package ``artifact``; the stage's info. ``base_dir``: where the
    fp16 guard's calibration files are (the recipe's folder). ``passes``: the pass list
    (``lowering.passes``); ``"default"`` is coremltools' own, for comparisons."""
    from edgebuild_coreml.lowering.reshape_shapes import solving_reshapes_directly

    _import_lowering_libraries()  # before the freeze, so the collections below skip them
    with _collections_skip_loaded_libraries(), solving_reshapes_directly():
        try:
            return _lower(model_path, artifact, params, registry, base_dir=base_dir or model_path.parent,
                          passes=passes)
        finally:
            # The saved program (its fp16 weights) is cyclic: without a collection it outlives the
            # stage and sits under the next one's peak (the compress stage's, say).
            gc.collect()


def _lower(model_path: Path, artifact: Path, params: LowerParams, registry, *, base_dir: Path, passes: str) -> dict:
    from edgebuild.plugin.graph import load_stage_model

    from edgebuild_coreml import compute as policy
    from edgebuild_coreml.lowering.converter import convert
    from edgebuild_coreml.lowering.names import renamings
    from edgebuild_coreml.lowering.package import save_mlpackage
    from edgebuild_coreml.memory import map_large_blocks

    map_large_blocks()
    compute = params.compute
    imported = model_path.parent / ARTIFACT if (model_path.parent / ARTIFACT).exists() else None
    if imported is not None:
        result = _from_mlpackage(imported)
    else:
        # the optimize stage's data file may link the import stage's
        result = convert(load_stage_model(model_path), target=params.deployment_target, precision=params.precision,
                         registry=registry, generate=params.generate)
    gc.collect()  # the (cyclic) ONNX graph, before coremltools' passes add their own copies
    rewrites = policy.apply_enabled_rewrites(result.program, compute.rewrites)
    info: dict = {}
    guard_run: dict = {}
    before_fp16_cast = None
    if params.calibration is not None:
        from edgebuild_coreml.fp16_guard import saturate_infinite_constants

        saturated = saturate_infinite_constants(result.program)
        stateful = result.stateful
        before_fp16_cast = _fp16_guard(guard_run, model_path, params.inputs, result.input_names,
                                       params.calibration.section, base_dir,
                                       samples=stateful.calibration_samples if stateful else None,
                                       cosine_min=None if stateful else params.calibration.cosine_min,
                                       policy=compute.policy, output_names=result.output_names)
    units = policy.compute_units_for(compute.policy)
    model = save_mlpackage(result, artifact, target=params.deployment_target, precision=params.precision,
                           input_specs=policy.shape_specs(params.inputs), compute_units=units,
                           metadata={policy.COMPUTE_UNITS_KEY: units.name},
                           before_fp16_cast=before_fp16_cast, consume=True, passes=passes)
    # The passes consumed the lowered program; the saved one is the model's. Pymil graphs are
    # cyclic (ops <-> vars), so what the passes dropped goes only when the collector runs.
    result.program = None
    program = _saved_program(model, artifact)
    del model
    gc.collect()  # also removes coremltools' temporary package, whose weight file links ours
    hashing = _hash_in_background(artifact)  # the store's scan of the output then reads nothing
    if params.calibration is not None:
        guard = guard_run.get("result")
        if guard is None:
            raise BuildError(f"{artifact.name}: coremltools' pipeline ran no fp16 cast pass, so the fp16 "
                             "guard measured nothing", hint="set compute.fp16_guard: false")
        info["fp16_guard"] = {**guard.to_json(), "saturated_constants": saturated}
        if guard.keep_fp32:  # apart from the guard's own record: this is what the passes after it made
            info["fp16_islands"] = check_kept_fp32(program, guard, artifact.name).to_json()
    renamed_inputs = {k: v for k, v in result.input_names.items() if k != v}
    plan = policy.plan_for(program, compute, shapes_dynamic=policy.range_inputs(params.inputs, result.input_names))
    error = policy.violation_error(plan, LABEL)
    if error is not None:
        error.program, error.renamed_inputs = program, renamed_inputs
        raise error
    if result.notes:
        info["notes"] = result.notes
    warnings = [policy.range_fallback_warning(plan, LABEL), policy.ane_absence_warning(plan, LABEL),
                _precision_warning(guard_run.get("result")), _conditioning_warning(guard_run.get("result"))]
    if any(warnings):
        info["warnings"] = [w for w in warnings if w]
    note = _conditioning_note(guard_run.get("result"))
    if note:  # validation's failures then say why no fp32 island could be trusted to hold the limit
        info["validation_note"] = note
    plan_json = {**plan.to_json(), **policy.per_shape_plans(
        program, compute, policy.shape_choices(params.inputs, result.input_names, params.generate))}
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


def _fp16_guard(record: dict, model_path: Path, recipe_inputs: dict, input_names: dict, section, base_dir: Path,
                samples=None, cosine_min: float | None = None, policy: str = "auto", output_names=None):
    """The ``before_fp16_cast`` hook: runs the program, still fp32 after coremltools' passes, on
    calibration inputs and names the ops to keep in fp32 (its GuardResult goes to ``record``).
    ``samples()``: the calibration inputs when the recipe's do not fit the program (a stateful
    decoder takes token ids and a position). ``cosine_min``: the recipe's limit, which the ops
    kept for precision are chosen to meet, judged as validation judges (``section``'s detections,
    named by the model's outputs: ``output_names`` maps them to the program's); a
    Neural-Engine-only ``policy`` cannot hold them."""
    from edgebuild_coreml import fp16_guard
    from edgebuild_coreml.fp16_sensitivity import judge_for
    from edgebuild_coreml.memory import return_freed_memory

    judge = judge_for(section, cosine_min, output_names or {}) if cosine_min is not None else None

    def before_fp16_cast(program) -> set[str]:
        # Inputs made one at a time as the guard runs them (a few MB each for an image model).
        calibration = samples() if samples is not None else fp16_guard.calibration_samples(
            section, model_path, recipe_inputs, base_dir, input_names)
        record["result"] = guard = fp16_guard.find_overflows(program, calibration, cosine_min=cosine_min,
                                                              judge=judge)
        return_freed_memory()  # the activations, before the cast pass copies constants
        _refuse_precision_islands_on_ane(guard.precision, policy)
        return guard.keep_fp32

    return before_fp16_cast


def _refuse_precision_islands_on_ane(precision, policy: str) -> None:
    """The Neural Engine computes in fp16 only: under ``ane_only`` the ops fp16 rounds too coarsely cannot
    move to an fp32 island, so the recipe's limit cannot be met."""
    from edgebuild_coreml.compute import PLACEMENTS

    if precision is None or not precision.kept or PLACEMENTS[policy].strict != "ane":
        return
    raise BuildError(
        f"{LABEL}: in fp16 the outputs reach an estimated cosine of {precision.fp16_cosine:.6f} on the "
        f"calibration inputs, below validate.thresholds.cosine_min {precision.cosine_min}; keeping "
        f"{_described(precision)} in fp32 would meet it, but compute.policy ane_only runs every op on the "
        "Neural Engine, which has no fp32",
        hint="set compute.policy: cpu_and_ne (those ops then run on the CPU), target.precision: float32, "
             "or a lower cosine_min")


def _described(precision) -> str:
    kinds = ", ".join(f"{count} {kind}" for kind, count in precision.kinds().items())
    return f"{len(precision.kept)} ops ({kinds})"


def _precision_warning(guard) -> str | None:
    """Which ops stay fp32 for precision, and what fp16 alone would have given."""
    precision = getattr(guard, "precision", None)
    if precision is None or not precision.kept:
        return None
    names = list(precision.kept)
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    return (f"{LABEL}: fp16 rounding takes the outputs to an estimated cosine of {precision.fp16_cosine:.6f} "
            f"on the calibration inputs, below validate.thresholds.cosine_min {precision.cosine_min}: "
            f"{_described(precision)} are kept in fp32 (estimated cosine {precision.kept_cosine:.6f}): {shown}")


def _ill_conditioned(guard):
    """The guard's precision result when fp16 rounding alone, redrawn, moves the outputs past the limit."""
    precision = getattr(guard, "precision", None)
    return precision if precision is not None and precision.ill_conditioned else None


def _conditioning_warning(guard) -> str | None:
    """The estimate cannot be trusted: fp16 rounding alone, redrawn, moves the outputs past the limit."""
    precision = _ill_conditioned(guard)
    if precision is None:
        return None
    low, high = precision.spread
    return (f"{LABEL}: fp16 results of this model vary between cosine {low:.6f} and {high:.6f} with the "
            f"rounding alone (the fp16 estimate redrawn with stochastic rounding, on the calibration inputs)"
            f"{_capped(precision)}, more than validate.thresholds.cosine_min {precision.cosine_min} allows: it is "
            "ill-conditioned in fp16, and whether the artifact passes depends on how its kernels round; build "
            "target.precision: float32, or set a lower cosine_min")


def _conditioning_note(guard) -> str | None:
    """What a failed validation of an ill-conditioned fp16 model adds to its message."""
    precision = _ill_conditioned(guard)
    if precision is None:
        return None
    low, high = precision.spread
    return (f"the lower stage found this model ill-conditioned in fp16 (its fp16 results vary between cosine "
            f"{low:.6f} and {high:.6f} with the rounding alone{_capped(precision)}): build target.precision: "
            "float32, or set a lower cosine_min")


def _capped(precision) -> str:
    """Where no island set within the guard's cap held the estimate's lower end: how far the cap got."""
    if precision.capped_cosine is None:
        return ""
    return (f"; keeping up to {precision.cap} ops in fp32, the most the guard keeps for precision, the lowest "
            f"redrawn estimate reaches only {precision.capped_cosine:.6f}")


def check_kept_fp32(program, guard, artifact_name: str):
    """The last line of defence: every value of the guard's islands the saved program still holds
    is computed in fp32 (whatever the passes after the cast named its op); returns the IslandCheck."""
    from edgebuild_coreml.fp16_guard import check_islands

    checked = check_islands(program, guard.island_values)
    if checked.in_fp16:
        wrong = ", ".join(f"{op} (as {', '.join(values)})" for op, values in sorted(checked.in_fp16.items()))
        raise BuildError(
            f"{artifact_name}: the fp16 guard asked to keep {wrong} in fp32, but the saved "
            "program computes them in fp16, so they would overflow",
            hint="set target.precision: float32, or compute.fp16_guard: false to accept the overflow",
        )
    return checked


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
    back to the collector when the last scope open ends (the executor opens one around every stage
    body, before this stage's own imports).
    """
    with older_objects_frozen():
        yield


def _hash_in_background(artifact: Path):
    """A started thread hashing the package's weight files (gigabytes for a decoder) on the other
    core while the plan is made; what it hashed is remembered by the store."""
    from edgebuild.plugin.store import hashed_once

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
