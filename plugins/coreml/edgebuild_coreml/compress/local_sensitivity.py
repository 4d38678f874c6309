"""Per-layer sensitivity from captured activations: each weight's own op, not the whole model.

Measuring a layer by running the model with only that weight compressed costs one forward
per (layer, candidate, sample): 150 linears x 4 candidates x 4 prompts is 2,400 forwards of
the full decoder. Here the calibration inputs run once; an observer keeps the inputs of every
op that reads a compressible weight, and a layer's error under a candidate is that op alone
evaluated with the original and with the decompressed weight — one op evaluation per
(layer, candidate, sample), about 1/L of a forward for a model of L such layers.

The local error is the relative noise power ``|y' - y|^2 / |y|^2`` of the op's output. Noise
from independent layers adds up in power, so these sum; one measured point per candidate
(the whole model compressed with it, which auto mode measures anyway) converts the sum into
the recipe's output metric, so a layer's estimate is in the same units as the budget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .sensitivity import Layer

Captured = list[dict[str, np.ndarray]]  # per sample: var name -> value


def capture_layer_inputs(program, layers: Sequence[Layer], calibration: Sequence[Mapping[str, np.ndarray]]) -> Captured:
    """For each sample, the values of every non-constant input of every op reading a layer's weight."""
    from edgebuild_coreml.interpreter import run_program

    consumers = _consumer_ops(program, layers)
    wanted = {var.name for op in consumers.values() for var in _inputs(op) if var.op is None or var.val is None}
    captured: Captured = []
    for sample in calibration:
        seen = {name: np.asarray(value) for name, value in sample.items() if name in wanted}

        def observe(op, outputs, seen=seen):
            for var, value in zip(op.outputs, outputs):
                if var.name in wanted:
                    seen[var.name] = np.asarray(value)

        run_program(program, sample, observer=observe)
        captured.append(seen)
    return captured


def local_noise_power(program, layer: Layer, replacement: np.ndarray, captured: Captured) -> float:
    """Relative output noise power of the ops reading ``layer``'s weight when it is ``replacement``."""
    from edgebuild_coreml.interpreter.loading import load_evaluators
    from edgebuild_coreml.interpreter.registry import EVALUATORS

    load_evaluators()
    consumers = _consumer_ops(program, [layer])
    noise = signal = 0.0
    for op in dict.fromkeys(consumers.values()):
        evaluate = EVALUATORS.get(op.op_type)
        for seen in captured:
            args, swapped = {}, {}
            for name, var in op.inputs.items():
                if isinstance(var, (list, tuple)):
                    args[name] = swapped[name] = [_value(v, seen) for v in var]
                    continue
                args[name] = _value(var, seen)
                is_weight = var.op is not None and var.op.name == layer.const
                swapped[name] = replacement.reshape(np.shape(args[name])) if is_weight else args[name]
            exact = np.asarray(_first(evaluate(op, args)), dtype=np.float64)
            approx = np.asarray(_first(evaluate(op, swapped)), dtype=np.float64)
            noise += float(np.sum((approx - exact) ** 2))
            signal += float(np.sum(exact ** 2))
    return noise / signal if signal > 0 else 0.0


def to_metric(powers: Mapping[str, float], measured: float, metric: str) -> dict[str, float]:
    """Per-layer estimates in ``metric`` units, scaled so they add up to the ``measured`` error of
    compressing every layer alike (rel_l2 adds in squares, cosine distance in power already)."""
    total = sum(powers.values())
    if metric == "rel_l2":
        factor = measured * measured / total if total > 0 else 0.0
        return {name: float(np.sqrt(p * factor)) for name, p in powers.items()}
    if metric == "max_abs":  # amplitudes, roughly additive in the worst case
        amplitude = {name: float(np.sqrt(p)) for name, p in powers.items()}
        total = sum(amplitude.values())
        return {name: a * measured / total if total > 0 else 0.0 for name, a in amplitude.items()}
    factor = measured / total if total > 0 else 0.0
    return {name: p * factor for name, p in powers.items()}


def _consumer_ops(program, layers: Sequence[Layer]) -> dict[str, object]:
    from .program import iter_ops

    names = {consumer for layer in layers for consumer in layer.consumers}
    return {op.name: op for op in iter_ops(program) if op.name in names}


def _inputs(op):
    for var in op.inputs.values():
        if isinstance(var, (list, tuple)):
            yield from var
        else:
            yield var


def _value(var, seen):
    if var.name in seen:
        return seen[var.name]
    if var.val is not None:
        return np.asarray(var.val)
    raise KeyError(f"no captured value for {var.name}")


def _first(result):
    return result[0] if isinstance(result, (list, tuple)) else result
