"""W8A8 activation quantisation with ranges calibrated by the MIL interpreter (runs on Linux).

coremltools' ``linear_quantize_activations`` gathers activation ranges by running the model
with Core ML, which exists only on Apple platforms. Here the same statistics come from running
the program in our MIL interpreter with an observer, and are handed to coremltools' own passes
(``insert_prefix_quantize_dequantize_pair``, ``insert_suffix_quantize_dequantize_pair``, then
``dequantize_quantize_pair_elimination``), so the inserted quantize/dequantize pairs are exactly
the ones coremltools would write for those ranges.

Ranges are plain min/max over every calibration sample (no percentile clipping), the statistic
coremltools' calibration uses too; unlike its helper, ours keeps the extremes across samples
rather than the last sample's. Inputs and outputs of one concat share a range, as in coremltools,
so a quantised concat needs no rescaling. Weights are left to the weight passes that follow
(linear int8 weights + these int8 activations make W8A8).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import coremltools as ct
import coremltools.optimize.coreml as cto
import numpy as np
from coremltools import _SPECIFICATION_VERSION_IOS_17
from coremltools.converters.mil.frontend.milproto import load as milproto_load
from coremltools.converters.mil.mil import types
from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY
from coremltools.models import utils as model_utils
from coremltools.optimize._utils import _adjust_concat_surrounding_activation_stats

from edgebuild.plugin import BuildError, RecipeError

from ..interpreter import run_program
from .program import iter_ops, load_program

ActivationStats = dict[str, dict[str, float]]

# coremltools registers these pass classes; we build fresh instances rather than setting
# options on the shared registry objects.
_PREFIX_PASS = "compression::insert_prefix_quantize_dequantize_pair"
_SUFFIX_PASS = "compression::insert_suffix_quantize_dequantize_pair"
_DEDUP_PASS = "common::dequantize_quantize_pair_elimination"
# The ops whose inputs and outputs those passes quantise.
_QUANTISED_OP_TYPES = {"conv", "linear", "add", "avg_pool", "max_pool"}


def calibrate_activation_ranges(
    program, samples: Sequence[Mapping[str, np.ndarray]], *, function: str = "main"
) -> ActivationStats:
    """{var name: {"rmin", "rmax"}} over all samples, for the inputs and every float op output."""
    stats: ActivationStats = {}

    def record(name: str, value) -> None:
        array = np.asarray(value)
        if array.size == 0 or not np.issubdtype(array.dtype, np.floating):
            return
        low, high = float(np.min(array)), float(np.max(array))
        seen = stats.get(name)
        if seen is None:
            stats[name] = {"rmin": low, "rmax": high}
        else:
            seen["rmin"], seen["rmax"] = min(seen["rmin"], low), max(seen["rmax"], high)

    def observe(op, outputs: list) -> None:
        for var, value in zip(op.outputs, outputs):
            record(var.name, value)

    for sample in samples:
        for name, value in sample.items():
            record(name, value)
        run_program(program, sample, function=function, observer=observe)
    return stats


def share_concat_ranges(program, stats: ActivationStats) -> None:
    """Give each concat's inputs and output one common range (in place), as coremltools does."""
    groups = []
    for op in iter_ops(program):
        if op.op_type == "concat":
            names = [var.name for var in op.inputs["values"]] + [op.outputs[0].name]
            groups.append([name for name in names if name in stats])
    groups = [group for group in groups if group]
    if groups:
        _adjust_concat_surrounding_activation_stats(groups, stats)


def activation_passes(stats: ActivationStats, config: cto.OptimizationConfig | None = None) -> list:
    """coremltools' activation-quantisation passes, fed ``stats`` instead of Core ML's."""
    config = config or cto.OptimizationConfig(
        global_config=cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int8")
    )
    prefix = type(PASS_REGISTRY[_PREFIX_PASS])(config=config)
    prefix.activation_stats = stats
    suffix = type(PASS_REGISTRY[_SUFFIX_PASS])()
    suffix.config = config
    suffix.activation_stats = stats
    return [prefix, suffix, PASS_REGISTRY[_DEDUP_PASS]]


def quantize_activations(
    model: ct.models.MLModel,
    samples: Sequence[Mapping[str, np.ndarray]] | None,
    *,
    source: str | Path = "model",
) -> tuple[ct.models.MLModel, ActivationStats]:
    """``model`` with int8 activations calibrated on ``samples``, and the ranges used."""
    if not samples:
        raise RecipeError(
            f"{source}: activation quantisation needs calibration samples",
            hint="give validate.inputs so the validation inputs can calibrate activations",
        )
    program = load_program(model)
    _check_float16_activations(program, source)
    _check_sample_names(program, samples, source)
    stats = calibrate_activation_ranges(program, samples)
    share_concat_ranges(program, stats)
    try:
        quantized = model_utils._apply_graph_pass(
            model,
            activation_passes(stats),
            spec_version=_SPECIFICATION_VERSION_IOS_17,
            pymil_load_func=milproto_load.load,
            skip_model_load=True,
        )
    except (KeyError, ValueError) as error:
        raise BuildError(
            f"{source}: inserting activation quantisation failed: {type(error).__name__}: {error}",
            hint="a tensor the passes quantise got no range from the calibration run; "
            "check that the calibration inputs reach every op",
        ) from error
    return quantized, stats


def _check_float16_activations(program, source) -> None:
    """coremltools' passes write fp16 scales, which an fp32 activation cannot take."""
    for op in iter_ops(program):
        if op.op_type in _QUANTISED_OP_TYPES and op.outputs[0].dtype == types.fp32:
            raise RecipeError(
                f"{source}: activation quantisation needs float16 activations; op {op.name!r} "
                f"({op.op_type}) computes in float32",
                hint="set target.precision: float16 for a variant with compression.activations",
            )


def _check_sample_names(program, samples, source) -> None:
    expected = set(program.functions["main"].inputs)
    for index, sample in enumerate(samples):
        missing = expected - set(sample)
        if missing:
            raise RecipeError(
                f"{source}: calibration sample {index} lacks input(s) {', '.join(sorted(missing))}",
                hint=f"the model's inputs are {', '.join(sorted(expected))}",
            )
