"""What Core ML itself plans, beside edgebuild's prediction (macOS only).

Core ML decides placement when it loads a compiled model; coremltools exposes that
decision as ``MLComputePlan``. On a Mac we load the artifact's compiled form, read each
operation's preferred device and estimated cost, and report how often the prediction
agrees. Elsewhere there is nothing to measure and the function says so.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

# coremltools' device classes, by name, so this module imports nothing heavy off macOS
_DEVICE_UNITS = {"MLCPUComputeDevice": "cpu", "MLGPUComputeDevice": "gpu", "MLNeuralEngineComputeDevice": "ane"}


@dataclass(frozen=True)
class MeasuredOp:
    name: str  # the name of the op's first output, as the predicted plan keys its ops
    op: str
    unit: str
    cost: float  # share of the model's estimated work, 0..1


def unit_of(device) -> str:
    return _DEVICE_UNITS.get(type(device).__name__, "cpu")


def agreement(predicted_ops: list[dict], measured: list[MeasuredOp]) -> dict:
    """Per-op comparison of a predicted plan (``Plan.to_json()["ops"]``) with Core ML's plan.

    Ops are matched by name; an op fused into another in the prediction is compared through
    its host. Returns the rate over the ops both sides know, the cost-weighted rate, and the
    disagreements.
    """
    predicted = {op["name"]: op for op in predicted_ops}
    rows, agree, weight, agree_weight = [], 0, 0.0, 0.0
    for actual in measured:
        guess = predicted.get(actual.name)
        if guess is None:
            continue
        host = predicted.get(guess.get("fused_into") or "", guess)
        match = host["unit"] == actual.unit
        agree += match
        weight += actual.cost
        agree_weight += actual.cost if match else 0.0
        rows.append({"name": actual.name, "op": actual.op, "predicted": host["unit"], "measured": actual.unit,
                     "cost": actual.cost, "agree": match})
    compared = len(rows)
    return {
        "compared": compared,
        "agreement": agree / compared if compared else None,
        "cost_weighted_agreement": agree_weight / weight if weight else None,
        "disagreements": [r for r in rows if not r["agree"]],
        "ops": rows,
    }


def measure(artifact: Path, compute_units: str = "ALL") -> list[MeasuredOp] | None:
    """Core ML's own plan for ``artifact`` (an .mlpackage), or None when not on macOS."""
    if platform.system() != "Darwin":
        return None
    import coremltools as ct
    from coremltools.models.compute_plan import MLComputePlan

    model = ct.models.MLModel(str(artifact), compute_units=getattr(ct.ComputeUnit, compute_units))
    plan = MLComputePlan.load_from_path(model.get_compiled_model_path(),
                                        compute_units=getattr(ct.ComputeUnit, compute_units))
    program = plan.model_structure.program
    if program is None:
        return []
    measured = []
    for op in program.functions["main"].block.operations:
        if op.operator_name == "const" or not op.outputs:
            continue
        usage = plan.get_compute_device_usage_for_mlprogram_operation(op)
        cost = plan.get_estimated_cost_for_mlprogram_operation(op)
        if usage is None:
            continue
        measured.append(MeasuredOp(op.outputs[0].name, op.operator_name, unit_of(usage.preferred_compute_device),
                                   cost.weight if cost is not None else 0.0))
    return measured


def compare_with_core_ml(artifact: Path, predicted: dict, compute_units: str = "ALL") -> dict:
    """The report's ``measured_plan`` section: agreement on a Mac, a plain note elsewhere."""
    measured = measure(artifact, compute_units)
    if measured is None:
        return {"skipped": "Core ML's compute plan can only be read on macOS; the plan above is a prediction"}
    return {"compute_units": compute_units, **agreement(predicted["ops"], measured)}
