"""How much each layer's compression alone hurts the model's outputs.

A layer is one stored weight (a ``const`` feeding compute ops). Its sensitivity to a mode is
the output error on the calibration inputs when only that weight is replaced by its
compressed-then-decompressed value. The replacement is done in memory on one loaded program
(the const's value is swapped, the program run, the value restored), so a trial costs one
interpreter run per sample and no package round trip.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .program import iter_ops, is_weight_op, weight_uses

Outputs = dict[str, np.ndarray]
METRICS = ("cosine_distance", "rel_l2", "max_abs")


@dataclass(frozen=True)
class Layer:
    """One compressible stored weight and every compute op input that reads it."""

    name: str  # the first use, "<op name>.<input name>", as in compress reports
    const: str  # name of the const op storing it
    uses: tuple[str, ...]
    consumers: tuple[str, ...]  # names of the compute ops reading it (for per-op overrides)
    shape: tuple[int, ...]
    bytes: int


def compressible_layers(program, min_elements: int) -> list[Layer]:
    """Uncompressed weights with at least ``min_elements`` values, in program order."""
    uses = weight_uses(program, min_elements=max(min_elements, 2))
    grouped: dict[str, list[str]] = {}
    for key, var in weight_vars(program, uses).items():
        if var.op.op_type == "const" and uses[key].mode == "none":
            grouped.setdefault(var.op.name, []).append(key)
    layers = []
    for const, keys in grouped.items():
        first = uses[keys[0]]
        consumers = tuple(dict.fromkeys(key.rsplit(".", 1)[0] for key in keys))
        layers.append(Layer(first.name, const, tuple(keys), consumers, first.shape, first.bytes))
    return layers


def weight_vars(program, keys) -> dict:
    """The Var feeding each "<op>.<input>" key of ``keys`` (those that exist in ``program``)."""
    wanted = set(keys)
    found = {}
    for op in iter_ops(program):
        if is_weight_op(op):
            continue
        for input_name, var in op.inputs.items():
            key = f"{op.name}.{input_name}"
            if key in wanted and not isinstance(var, (list, tuple)):
                found[key] = var
    return found


def dense_value(var) -> np.ndarray:
    """The value a const or constexpr chain decompresses to, as the reference executor computes it."""
    from edgebuild_coreml.interpreter.loading import load_evaluators
    from edgebuild_coreml.interpreter.registry import EVALUATORS

    op = var.op
    if op.op_type == "const":
        return np.asarray(var.val)
    load_evaluators()
    args = {name: dense_value(inner) if inner.op is not None and is_weight_op(inner.op) else inner.val
            for name, inner in op.inputs.items()}
    return np.asarray(EVALUATORS[op.op_type](op, args))


def run_samples(program, calibration: Sequence[Mapping[str, np.ndarray]]) -> list[Outputs]:
    from edgebuild_coreml.interpreter import run_program

    return [run_program(program, sample) for sample in calibration]


def output_error(reference: Sequence[Outputs], candidate: Sequence[Outputs], metric: str) -> float:
    """The worst output's ``metric`` over all samples (each output flattened across samples).

    cosine_distance is ``1 - cosine`` and rel_l2 ``|c - r| / |r|``, both of the flattened
    output; max_abs the largest absolute difference. Non-finite candidates count as infinite.
    """
    worst = 0.0
    for name in reference[0]:
        r = np.concatenate([np.asarray(s[name], dtype=np.float64).ravel() for s in reference])
        c = np.concatenate([np.asarray(s[name], dtype=np.float64).ravel() for s in candidate])
        if not np.all(np.isfinite(c[np.isfinite(r)])):
            return float("inf")
        worst = max(worst, _metric(r, c, metric))
    return worst


def _metric(r: np.ndarray, c: np.ndarray, metric: str) -> float:
    if metric == "max_abs":
        return float(np.max(np.abs(c - r), initial=0.0))
    norm_r = float(np.linalg.norm(r))
    if metric == "rel_l2":
        return float(np.linalg.norm(c - r)) / max(norm_r, 1e-30)
    norm_c = float(np.linalg.norm(c))
    if norm_r == 0 or norm_c == 0:
        return 0.0 if norm_r == norm_c else 1.0
    return float(max(0.0, 1.0 - np.dot(r, c) / (norm_r * norm_c)))


def measure_sensitivity(
    program,
    layer: Layer,
    replacement: np.ndarray,
    calibration: Sequence[Mapping[str, np.ndarray]],
    reference: Sequence[Outputs],
    metric: str,
) -> float:
    """Output error with only ``layer``'s weight replaced by ``replacement``."""
    var = weight_vars(program, layer.uses[:1])[layer.name]
    with swapped_value(var, replacement):
        return output_error(reference, run_samples(program, calibration), metric)


class swapped_value:
    """Context manager: ``var`` (a const's output) holds ``value`` inside the block."""

    def __init__(self, var, value: np.ndarray):
        self._holder = var._sym_val
        original = self._holder.val
        self._original = original
        self._value = np.asarray(value).astype(np.asarray(original).dtype).reshape(np.shape(original))

    def __enter__(self):
        self._holder.val = self._value
        return self

    def __exit__(self, *exc):
        self._holder.val = self._original
        return False


def sensitivity_table(
    program,
    layers: Sequence[Layer],
    replacements: Mapping[tuple[str, int], np.ndarray],
    calibration: Sequence[Mapping[str, np.ndarray]],
    reference: Sequence[Outputs],
    metric: str,
    progress: Callable[[str], None] | None = None,
) -> dict[tuple[str, int], float]:
    """Error for every (layer name, candidate index) that has a replacement."""
    by_name = {layer.name: layer for layer in layers}
    errors = {}
    for (name, index), value in replacements.items():
        errors[(name, index)] = measure_sensitivity(program, by_name[name], value, calibration, reference, metric)
        if progress is not None:
            progress(f"{name} candidate {index}: {errors[(name, index)]:.3g}")
    return errors
