"""The recipe's ``compute`` section applied to a Core ML build.

Maps a policy to the ``ct.ComputeUnit`` stored with the artifact, turns the recipe's input
shapes into coremltools shape specs, runs the enabled ANE rewrites, plans the saved program and
enforces the strict policies (``ane_only`` / ``gpu_only``), which Core ML itself cannot promise.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Mapping

from edgebuild.plugin import BuildError, RecipeError, UsageError
from edgebuild.plugin.recipe import Compute, ComputePolicy, closest, has_range, whole_shapes

COMPUTE_UNITS_KEY = "com.edgebuild.compute_units"
# the keys of ane.rewrites.REWRITES, here so a recipe check need not import coremltools
REWRITE_NAMES = ("linear_to_conv", "split_attention_heads", "clamp_norm_epsilon", "ane_layout")

# Enumerated shapes are planned one by one (a decoder's query lengths); past this many
# combinations the plan keeps to the flexible program alone.
MAX_PLANNED_SHAPES = 16

# The fp16 guard runs the interpreter once per sample, on at most this many of the validation
# inputs; here (not in fp16_guard) so the lower stage's cache key can say so without its imports.
FP16_GUARD_SAMPLES = 4



@dataclass(frozen=True)
class Placement:
    """What one compute.policy means for a Core ML artifact and its plan."""

    compute_units: str  # the ct.ComputeUnit the artifact is saved with
    units: tuple[str, ...]  # the units the plan may put an op on
    strict: str | None = None  # the one unit every op must be on (ane_only, gpu_only)


# One row per value of the recipe's ComputePolicy (a test holds the two lists equal); the recipe
# refuses any other value at load, so nothing here checks a policy again. Core ML has no "only
# the ANE" or "only the GPU" setting: the strict policies use the closest compute units, plan
# with the CPU as the fallback Core ML always keeps, and rely on the plan check for the promise.
PLACEMENTS: dict[ComputePolicy, Placement] = {
    "auto": Placement("ALL", ("ane", "gpu", "cpu")),
    "all": Placement("ALL", ("ane", "gpu", "cpu")),
    "cpu_only": Placement("CPU_ONLY", ("cpu",)),
    "cpu_and_gpu": Placement("CPU_AND_GPU", ("gpu", "cpu")),
    "cpu_and_ne": Placement("CPU_AND_NE", ("ane", "cpu")),
    "ane_only": Placement("CPU_AND_NE", ("ane", "cpu"), strict="ane"),
    "gpu_only": Placement("CPU_AND_GPU", ("gpu", "cpu"), strict="gpu"),
}


def compute_field(compute: Compute | Mapping[str, Any], name: str):
    """A field of the recipe's compute section: the typed model, or its JSON dump as stage
    parameters carry it. Defaults were applied at load; none is applied again here."""
    return compute[name] if isinstance(compute, Mapping) else getattr(compute, name)


class PolicyViolation(BuildError):
    """A strict compute policy (``ane_only`` / ``gpu_only``) cannot be met by some ops."""

    def __init__(self, message: str, *, hint: str | None = None, violations: list[dict] | None = None):
        super().__init__(message, hint=hint)
        self.violations = violations or []
        # Set by the lower stage, so `edgebuild plan` can still show the plan of the failed build.
        self.program = None
        self.renamed_inputs: dict[str, str] = {}


def compute_units_for(policy: ComputePolicy):
    """The ``ct.ComputeUnit`` an artifact built under ``policy`` should be loaded with."""
    import coremltools as ct

    return getattr(ct.ComputeUnit, PLACEMENTS[policy].compute_units)


# -- input shapes -----------------------------------------------------------------------------


def _dim_spec(dim, where: str):
    """One recipe dim -> (save_mlpackage dim, enumerated sizes or None)."""
    if isinstance(dim, int):
        return dim, None
    if isinstance(dim, Mapping) and "range" in dim:
        low, high = dim["range"]
        return [int(low), int(high)], None
    if isinstance(dim, Mapping) and "enumerated" in dim:
        return None, [int(v) for v in dim["enumerated"]]
    raise UsageError(
        f"{where} is {dim!r}: Core ML needs a fixed size, a range or an enumeration",
        hint="write an int, {range: [low, high]} or {enumerated: [a, b, ...]}",
    )


def shape_specs(recipe_inputs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The recipe's ``source.inputs`` as ``save_mlpackage`` input specs.

    Inputs without a shape (the model's own is used) and fixed-value inputs (folded away by the
    frontend) are left out. Enumerated dims become the list of every combination of sizes.
    """
    specs = {}
    for name, spec in recipe_inputs.items():
        if spec.get("value") is not None or not spec.get("shape"):
            continue
        where = f"source.inputs.{name}.shape"
        shapes = whole_shapes(spec["shape"])
        if shapes is not None:
            specs[name] = {"shapes": shapes}
            continue
        dims, choices = [], []
        for index, dim in enumerate(spec["shape"]):
            fixed, options = _dim_spec(dim, f"{where}[{index}]")
            dims.append(fixed)
            choices.append(options)
        if not any(choices):
            specs[name] = dims
            continue
        if any(isinstance(d, list) for d in dims):
            raise UsageError(f"{where}: Core ML cannot mix range and enumerated dims in one input",
                             hint="use ranges only, or enumerate every flexible dim")
        per_dim = [options if options else [fixed] for fixed, options in zip(dims, choices)]
        specs[name] = {"shapes": [list(shape) for shape in itertools.product(*per_dim)]}
    return specs


def range_inputs(recipe_inputs: Mapping[str, Mapping[str, Any]], renamed: Mapping[str, str]) -> set[str]:
    """MIL names of the inputs with a range (dynamic) dim: the plan treats their shapes as unknown."""
    names = set()
    for name, spec in recipe_inputs.items():
        if has_range(spec.get("shape")):
            names.add(renamed.get(name, name))
    return names


def enumerated_choices(recipe_inputs: Mapping[str, Mapping[str, Any]], renamed: Mapping[str, str]) -> list[dict]:
    """Every combination of the inputs' enumerated shapes, as {MIL input name: shape}; [] when no
    input is enumerated or there are more than ``MAX_PLANNED_SHAPES`` combinations."""
    specs = shape_specs(recipe_inputs)
    enumerated = {renamed.get(name, name): spec["shapes"] for name, spec in specs.items()
                  if isinstance(spec, Mapping) and len(spec.get("shapes") or []) > 1}
    if not enumerated:
        return []
    names = list(enumerated)
    combos = list(itertools.islice(itertools.product(*(enumerated[n] for n in names)), MAX_PLANNED_SHAPES + 1))
    if len(combos) > MAX_PLANNED_SHAPES:
        return []
    return [{name: tuple(shape) for name, shape in zip(names, combo)} for combo in combos]


def shape_choices(recipe_inputs: Mapping[str, Mapping[str, Any]], renamed: Mapping[str, str],
                  generate: Mapping[str, Any] | None = None) -> list[dict]:
    """:func:`enumerated_choices`; for a generative recipe (``generate``), one choice per
    enumerated query length of ``input_ids`` (the stateful artifact's only flexible input)."""
    lengths = (generate or {}).get("query_lengths")
    if isinstance(lengths, list) and len(lengths) > 1:
        return [{"input_ids": (1, int(length))} for length in sorted(lengths)]
    return enumerated_choices(recipe_inputs, renamed)


def per_shape_plans(program, compute: Compute | Mapping[str, Any], choices: list[dict], *,
                    chip: str | None = None) -> dict:
    """``{"per_shape": rows}`` (one compute-plan summary per enumerated shape), ``{}`` without
    choices, or ``{"per_shape_error": why}`` when the program cannot be fixed to them."""
    if not choices:
        return {}
    from edgebuild_coreml.ane.per_shape import plan_per_shape

    try:
        rows = plan_per_shape(program, choices, chip=chip or compute_field(compute, "chip"),
                              policy=compute_field(compute, "policy"), overrides=compute_field(compute, "overrides"))
    except Exception as exc:  # noqa: BLE001 - coremltools' materialisation refuses some programs; the plan stands without
        return {"per_shape_error": f"{type(exc).__name__}: {exc}"}
    return {"per_shape": rows}


def ane_layout_preview(program, compute: Compute | Mapping[str, Any], choices: list[dict], *,
                       chip: str | None = None) -> dict:
    """``{"ane_layout_preview": {...}}``: when ``compute.rewrites.ane_layout`` is off, the policy allows
    the Neural Engine and the rewrite would change the program, the plan summary without and with
    it (whole program, and per enumerated shape); ``{}`` otherwise. ``program`` is not touched."""
    if compute_field(compute, "rewrites").get("ane_layout"):
        return {}
    if PLACEMENTS[compute_field(compute, "policy")].compute_units not in ("ALL", "CPU_AND_NE"):
        return {}
    from edgebuild_coreml.ane.per_shape import specialise, summary
    from edgebuild_coreml.ane.rewrites import ane_layout, may_change_layout

    if not may_change_layout(program):
        return {}  # no copy of a model the rewrite cannot touch (most vision models)
    try:
        rewritten = specialise(program, {})
    except Exception as exc:  # noqa: BLE001 - as in per_shape_plans: no preview, the plan stands
        return {"ane_layout_preview": {"error": f"{type(exc).__name__}: {exc}"}}
    sites = ane_layout(rewritten)
    if not sites:
        return {}
    preview = {"sites": sites, "before": summary(plan_for(program, compute, chip=chip)),
               "after": summary(plan_for(rewritten, compute, chip=chip))}
    before_rows = per_shape_plans(program, compute, choices, chip=chip).get("per_shape")
    after_rows = per_shape_plans(rewritten, compute, choices, chip=chip).get("per_shape")
    if before_rows and after_rows:
        preview["per_shape"] = [{"before": b, "after": a} for b, a in zip(before_rows, after_rows)]
    return {"ane_layout_preview": preview}


# -- rewrites, plan, strict policies ----------------------------------------------------------


def check_compute_names(compute) -> None:
    """compute.chip and compute.rewrites name things this plugin has (RecipeError with the path)."""
    from edgebuild_coreml.ane.chips import load_chips, normalise_chip_name

    chips = load_chips()
    if normalise_chip_name(compute.chip) not in chips:
        raise RecipeError(f"unknown chip {compute.chip!r}" + closest(normalise_chip_name(compute.chip), chips),
                          path=("compute", "chip"))
    for name in compute.rewrites:
        if name not in REWRITE_NAMES:
            raise RecipeError(f"unknown ANE rewrite {name!r}" + closest(name, REWRITE_NAMES),
                              path=("compute", "rewrites", name))


def enabled_rewrites(rewrites: Mapping[str, bool]) -> list[str]:
    return [name for name, enabled in rewrites.items() if enabled]


def apply_enabled_rewrites(program, rewrites: Mapping[str, bool]) -> dict[str, int]:
    """Run the rewrites switched on in ``compute.rewrites`` on ``program`` in place."""
    names = enabled_rewrites(rewrites)
    if not names:
        return {}
    from edgebuild_coreml.ane import apply_rewrites

    return apply_rewrites(program, names)


def plan_for(program, compute: Compute | Mapping[str, Any], *, chip: str | None = None,
             shapes_dynamic: set[str] | None = None):
    """The compute plan of ``program`` under the recipe's compute section (``chip`` overrides)."""
    from edgebuild_coreml.ane import plan_program

    return plan_program(
        program,
        chip=chip or compute_field(compute, "chip"),  # chip: `edgebuild plan --chip`, checked by get_chip
        policy=compute_field(compute, "policy"),
        overrides=compute_field(compute, "overrides"),
        shapes_dynamic=shapes_dynamic,
    )


def violation_error(plan, where: str) -> PolicyViolation | None:
    """A build error listing every op the plan places off a strict policy's unit, or None if all are on it.

    ``where`` names what the user wrote (the recipe file and variant).
    """
    violations = plan.violations()
    if not violations:
        return None
    unit = violations[0]["unit"].upper()
    lines = []
    for entry in violations:
        for reason in entry["reasons"]:
            message = reason["message"]
            if entry["name"] not in message:
                message = f"{entry['op']} '{entry['name']}': {message}"
            lines.append(f"  - {message}" + (f" (fix: {reason['fix']})" if reason.get("fix") else ""))
    placed = sorted({entry["placed"].upper() for entry in violations})
    return PolicyViolation(
        f"{where}: compute.policy {plan.policy} needs every op on the {unit}, but the plan places "
        f"{len(violations)} of {len(plan.ops)} op(s) on the {' and '.join(placed)}:\n" + "\n".join(lines),
        hint=f"apply the fixes above, or relax compute.policy (e.g. "
             f"{'cpu_and_ne' if unit == 'ANE' else 'cpu_and_gpu'}); `edgebuild plan` shows the full plan",
        violations=violations,
    )


def range_fallback_warning(plan, where: str, shown: int = 5) -> str | None:
    """A warning naming the ops a range-flexible input keeps off the Neural Engine, or None.

    Under a policy without the Neural Engine there is nothing to push off it: no warning then.
    """
    names = plan.range_fallback()
    if not names or "ane" not in PLACEMENTS[plan.policy].units:
        return None
    listed = ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
    return (f"{where}: range-flexible input shapes keep {len(names)} of {len(plan.ops)} op(s) off the Neural "
            f"Engine ({listed}); enumerated shapes ({{enumerated: [...]}}) or fixed sizes keep them eligible")


def ane_absence_warning(plan, where: str, top: int = 3) -> str | None:
    """A warning when the policy allows the Neural Engine but the plan puts no op there, with the
    most common reasons; None otherwise (strict policies fail instead, see ``violation_error``)."""
    from collections import Counter

    placement = PLACEMENTS[plan.policy]
    if placement.strict or "ane" not in placement.units or not plan.ops:
        return None
    if any(op.unit == "ane" for op in plan.ops):
        return None
    counts, example = Counter(), {}
    for op in plan.ops:
        if op.fused_into:
            continue  # its host speaks for it
        for reason in plan.why_not(op, "ane"):
            counts[reason.rule] += 1
            example.setdefault(reason.rule, reason)
    reasons = "; ".join(f"{example[rule].message} ({count} op{'s' if count > 1 else ''}, fix: {example[rule].fix})"
                        for rule, count in counts.most_common(top))
    return (f"{where}: compute.policy {plan.policy} allows the Neural Engine, but the plan puts 0% of the model "
            f"there. Top reasons: {reasons}")
