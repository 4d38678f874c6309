"""Automatic mixed precision: per-layer compression modes chosen to meet a size or error budget.

1. Every candidate mode is applied to the whole model once, through the same
   ``compress_mlpackage`` the plain modes use. That gives each (layer, mode) its real stored
   bytes and its decompressed weight, and a uniform allocation's measured size and error.
2. Sensitivity, measured while each candidate's package is at hand (so decompressed weights
   are never all held at once): ``forward`` swaps each layer's decompressed weight into the
   loaded uncompressed program and runs the calibration inputs (see ``sensitivity``), one
   forward per (layer, mode, sample); ``activations`` evaluates only the ops reading that
   weight on inputs captured in one forward (see ``local_sensitivity``), for models with many
   layers. ``auto`` picks forward while layers x modes is at most ``FORWARD_TRIALS_MAX``.
3. Allocation: per-layer errors are summed as an additive proxy (squared first for rel_l2,
   since independent noise adds in power) and a knapsack picks one mode per layer.
4. Verification: the allocation is compressed for real (by const, see ``mixed``) and its package
   size and output error measured; if the budget is missed, the proxy budget is tightened
   and the allocation redone, a bounded number of times.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgebuild.plugin import RecipeError

from . import allocate
from .apply import compress_mlpackage
from .config import AutoCompression, CompressionSection, KeepWeights, LinearWeights, PalettizeWeights
from .mixed import compress_per_const
from .local_sensitivity import capture_layer_inputs, local_noise_power, to_metric
from .sensitivity import (
    Layer,
    compressible_layers,
    dense_value,
    measure_sensitivity,
    output_error,
    run_samples,
    weight_vars,
)

MEGABYTE = 1_000_000
MAX_VERIFY_ROUNDS = 4
FORWARD_TRIALS_MAX = 64  # whole-model forwards per sample that ``sensitivity: auto`` still pays for


def auto_compress(
    src: Path,
    dst: Path,
    auto: AutoCompression,
    *,
    calibration: Sequence[Mapping[str, np.ndarray]],
    weight_threshold: int = 2048,
) -> dict:
    """Compress ``src`` into ``dst`` with per-layer modes meeting ``auto``'s budget.

    Returns ``compress_mlpackage``'s report plus ``"auto"``: the chosen mode per layer, every
    layer's sensitivities, the size/error points tried, the budget and whether it was met.
    """
    from edgebuild_coreml.interpreter import load_mlpackage

    src, dst = Path(src), Path(dst)
    if not calibration:
        raise RecipeError(
            f"{src.name}: compression.auto needs calibration inputs to measure each layer's error",
            hint="add a validate section with inputs (random, files or tokens)",
        )
    calibration = list(calibration)[: auto.samples]
    program = load_mlpackage(src)
    layers = compressible_layers(program, weight_threshold)
    reference = run_samples(program, calibration)
    base_size = package_bytes(src)

    method = sensitivity_method(auto, len(layers))
    measure = _measurer(method, program, layers, calibration, reference, auto.metric)

    dst.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".auto.", dir=dst.parent))
    try:
        trials = _try_candidates(src, scratch, auto, layers, weight_threshold, calibration, reference, measure)
        table = _option_table(layers, auto, trials, base_size)
        table.method = method
        points = [{"size_mb": base_size / MEGABYTE, "error": 0.0, "label": "uncompressed", "measured": True}]
        points += [trial.point for trial in trials if trial is not None]
        return _allocate_and_verify(src, dst, scratch, auto, table, points, calibration, reference,
                                    weight_threshold=weight_threshold)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# -- 1. every candidate applied uniformly -------------------------------------------------------


@dataclass
class CandidateTrial:
    """One candidate applied to every layer: per-layer stored bytes and measured errors."""

    bytes: dict[str, int]
    errors: dict[str, float]  # only layers the candidate actually compressed
    overhead_per_layer: float  # package bytes beyond the weights, per compressed layer
    point: dict


def sensitivity_method(auto: AutoCompression, layer_count: int) -> str:
    """``forward`` or ``activations``: the recipe's choice, or by the forwards it would cost."""
    if auto.sensitivity != "auto":
        return auto.sensitivity
    trials = layer_count * sum(not isinstance(c, KeepWeights) for c in auto.candidates)
    return "forward" if trials <= FORWARD_TRIALS_MAX else "activations"


def _measurer(method, program, layers, calibration, reference, metric):
    """``measure(layer names, dense(name), whole-model error) -> error by layer name`` for one candidate."""
    by_name = {layer.name: layer for layer in layers}
    # ``dense(name)`` decompresses one layer when asked, so one layer's floats exist at a time.
    if method == "forward":
        def measure(names, dense, _measured):
            return {name: measure_sensitivity(program, by_name[name], dense(name), calibration, reference, metric)
                    for name in names}
        return measure

    captured = capture_layer_inputs(program, layers, calibration)

    def measure(names, dense, measured):
        powers = {name: local_noise_power(program, by_name[name], dense(name), captured) for name in names}
        return to_metric(powers, measured, metric)
    return measure


def _try_candidates(src, scratch, auto, layers, weight_threshold, calibration, reference, measure):
    from edgebuild_coreml.interpreter import load_mlpackage

    from .program import weight_uses

    base_program = load_mlpackage(src)
    base_weight_bytes = sum(use.bytes for use in weight_uses(base_program).values())
    base_overhead = package_bytes(src) - base_weight_bytes
    trials: list[CandidateTrial | None] = []
    for index, candidate in enumerate(auto.candidates):
        if isinstance(candidate, KeepWeights):
            trials.append(None)
            continue
        out = scratch / f"candidate{index}.mlpackage"
        compress_mlpackage(src, out, CompressionSection(weights=candidate, weight_threshold=weight_threshold))
        compressed = load_mlpackage(out)
        uses = weight_uses(compressed)
        variables = weight_vars(compressed, [layer.name for layer in layers])
        compressed_layers = [layer.name for layer in layers
                             if layer.name in variables and uses[layer.name].mode != "none"]
        size = package_bytes(out)
        extra = size - base_overhead - sum(use.bytes for use in uses.values())
        error = output_error(reference, run_samples(compressed, calibration), auto.metric)
        errors = measure(compressed_layers, lambda name: dense_value(variables[name]), error)
        del compressed, variables
        trials.append(CandidateTrial(
            bytes={layer.name: uses[layer.name].bytes for layer in layers if layer.name in uses},
            errors=errors,
            overhead_per_layer=max(extra, 0) / max(len(compressed_layers), 1),
            point={"size_mb": size / MEGABYTE, "error": error, "label": f"all {candidate_label(candidate)}",
                   "measured": True},
        ))
        shutil.rmtree(out, ignore_errors=True)
    return trials


def candidate_label(candidate) -> str:
    """A short name for a candidate mode, e.g. "palettize 4-bit" or "linear int8"."""
    if isinstance(candidate, PalettizeWeights):
        grouped = f" g{candidate.group_size}" if candidate.granularity == "per_grouped_channel" else ""
        return f"palettize {candidate.nbits}-bit{grouped}"
    if isinstance(candidate, LinearWeights):
        detail = {"per_tensor": " per-tensor", "per_block": f" block {candidate.block_size}"}.get(candidate.granularity, "")
        return f"linear {candidate.dtype}{detail}{'' if candidate.symmetric else ' asym'}"
    return "none"


# -- 2./3. options per layer and the allocation -------------------------------------------------


@dataclass
class OptionTable:
    """Per layer, per candidate: package bytes and measured error (inf: not applicable)."""

    layers: list[Layer]
    labels: list[str]
    candidates: list
    bytes: list[list[int]]
    errors: list[list[float]]
    fixed_bytes: int  # package bytes that no candidate changes
    method: str = "forward"  # how the errors were measured (``sensitivity_method``)

    def options(self, metric: str) -> list[list[allocate.Option]]:
        return [[allocate.Option(b, additive_cost(e, metric)) for b, e in zip(row_b, row_e)]
                for row_b, row_e in zip(self.bytes, self.errors)]


def _option_table(layers, auto, trials, base_size) -> OptionTable:
    sizes, errs = [], []
    for layer in layers:
        row_b, row_e = [], []
        for trial in trials:
            if trial is None:  # mode none: the weight as stored, no error
                row_b.append(layer.bytes)
                row_e.append(0.0)
            elif layer.name in trial.errors:
                row_b.append(int(round(trial.bytes[layer.name] + trial.overhead_per_layer)))
                row_e.append(trial.errors[layer.name])
            else:
                row_b.append(layer.bytes)
                row_e.append(math.inf)
        sizes.append(row_b)
        errs.append(row_e)
    # A layer no candidate applies to keeps its weight as stored (an extra, last option).
    for row_b, row_e, layer in zip(sizes, errs, layers):
        if not any(math.isfinite(e) for e in row_e):
            row_b.append(layer.bytes)
            row_e.append(0.0)
    fixed = base_size - sum(layer.bytes for layer in layers)
    labels = [candidate_label(c) for c in auto.candidates]
    return OptionTable(list(layers), labels, list(auto.candidates), sizes, errs, fixed)


def additive_cost(error: float, metric: str) -> float:
    """The per-layer quantity that adds up across layers (rel_l2 adds in squares)."""
    return error * error if metric == "rel_l2" else error


def from_additive(cost: float, metric: str) -> float:
    return math.sqrt(cost) if metric == "rel_l2" else cost


def _allocate_and_verify(src, dst, scratch, auto, table: OptionTable, points, calibration, reference, *,
                         weight_threshold) -> dict:
    from edgebuild_coreml.interpreter import load_mlpackage

    front = allocate.frontier(table.options(auto.metric))
    for size, cost in allocate.pareto_points(front):
        points.append({"size_mb": (size + table.fixed_bytes) / MEGABYTE, "error": from_additive(cost, auto.metric),
                       "label": "estimate", "measured": False})
    by_size = auto.max_size_mb is not None
    budget = auto.max_size_mb * MEGABYTE if by_size else auto.max_error
    proxy_budget = budget - table.fixed_bytes if by_size else additive_cost(budget, auto.metric)

    best, tried = None, []
    for attempt in range(1, MAX_VERIFY_ROUNDS + 1):
        if by_size:
            picked = allocate.least_cost_within(front, proxy_budget)
        else:
            picked = allocate.smallest_within(front, proxy_budget)
        if picked is None:  # nothing fits: the smallest (size) or most accurate (error) allocation
            picked = _fallback(table, auto.metric, by_size)
        if picked in tried:  # tightening changed nothing, or nothing tighter exists
            break
        tried.append(picked)
        out = scratch / f"auto{attempt}.mlpackage"
        report = compress_per_const(src, out, allocation_modes(table, picked), weight_threshold=weight_threshold)
        size = package_bytes(out)
        error = output_error(reference, run_samples(load_mlpackage(out), calibration), auto.metric)
        points.append({"size_mb": size / MEGABYTE, "error": error, "label": f"auto (round {attempt})",
                       "measured": True})
        met = size <= budget if by_size else error <= budget
        current = (met, picked, out, report, size, error)
        if best is None or _better(current, best, by_size):
            best = current
        if met:
            break
        # Tighten the proxy by how far the real package missed, and allocate again.
        if by_size:
            proxy_budget -= (size - budget) * 1.05 + 1
        else:
            proxy_budget *= additive_cost(budget / error, auto.metric) * 0.9

    met, picked, out, report, size, error = best
    _move_into_place(out, dst)
    report["auto"] = _auto_report(table, picked, points, auto, met, size, error)
    return report


def _better(candidate, incumbent, by_size: bool) -> bool:
    """Met beats not met; among met, the lower error (size) or smaller size (error budget)."""
    met, _, _, _, size, error = candidate
    best_met, _, _, _, best_size, best_error = incumbent
    if met != best_met:
        return met
    if met:
        return error < best_error if by_size else size < best_size
    return size < best_size if by_size else error < best_error


def _fallback(table: OptionTable, metric: str, by_size: bool) -> list[int]:
    picked = []
    for row_b, row_e in zip(table.bytes, table.errors):
        usable = [j for j, e in enumerate(row_e) if math.isfinite(e)]
        key = (lambda j: (row_b[j], row_e[j])) if by_size else (lambda j: (row_e[j], row_b[j]))
        picked.append(min(usable, key=key))
    return picked


def allocation_modes(table: OptionTable, picked: Sequence[int]) -> dict:
    """Const name -> weights config of every layer the allocation compresses."""
    modes = {}
    for layer, index in zip(table.layers, picked):
        candidate = table.candidates[index] if index < len(table.candidates) else None
        if candidate is not None and not isinstance(candidate, KeepWeights):
            modes[layer.const] = candidate
    return modes


def _auto_report(table: OptionTable, picked, points, auto, met, size, error) -> dict:
    chosen, sensitivity = [], []
    for layer, index, row_b, row_e in zip(table.layers, picked, table.bytes, table.errors):
        label = table.labels[index] if index < len(table.labels) else "none"
        chosen.append({"layer": layer.name, "mode": label, "bytes": row_b[index], "error": row_e[index]})
        sensitivity.append({
            "layer": layer.name,
            "shape": list(layer.shape),
            "candidates": [{"mode": lab, "bytes": b, "error": e if math.isfinite(e) else None}
                           for lab, b, e in zip(table.labels, row_b, row_e)],
        })
    budget = {"max_size_mb": auto.max_size_mb} if auto.max_size_mb is not None else {"max_error": auto.max_error}
    budget["metric"] = auto.metric
    return {
        "chosen": chosen,
        "sensitivity": sensitivity,
        "points": points,
        "budget": budget,
        "sensitivity_method": table.method,
        "met": bool(met),
        "size_mb": size / MEGABYTE,
        "error": error,
    }


# -- files ------------------------------------------------------------------------------------------


def package_bytes(path: Path) -> int:
    """Bytes of every file in a package (or of a single file)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _move_into_place(src: Path, dst: Path) -> None:
    """Replace ``dst`` by ``src`` (both in one directory, so the rename is atomic)."""
    if dst.exists():
        retired = src.with_name(src.name + ".previous")
        os.replace(dst, retired)
        shutil.rmtree(retired, ignore_errors=True)
    os.replace(src, dst)
