"""The fp16 guard's precision search: a program within fp16's range but not its precision.

The hand-built case is a batch norm folded into a scale whose bias cancels most of the product
(``x * 5000 - 50025`` on inputs in [10, 10.01)): fp16 rounds the input and the product to steps as large
as the signal left after the bias, so the outputs drift far below a 0.999 cosine. The guard keeps
that part in fp32, and not the harmless op after it.
"""

from __future__ import annotations

import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb

from edgebuild.plugin import BuildError
from edgebuild_coreml import fp16_guard
from edgebuild_coreml.fp16_sensitivity import PrecisionResult, segments_of, worst_cosine
from edgebuild_coreml.interpreter import run_program
from edgebuild_coreml.lower import _precision_warning, _refuse_precision_islands_on_ane
from edgebuild_coreml.lowering.converter import ConvertResult
from edgebuild_coreml.lowering.package import save_mlpackage

SHAPE = (1, 256)
RNG = np.random.default_rng(0)
SAMPLES = [{"x": (10.0 + 0.01 * RNG.random(SHAPE)).astype(np.float32)} for _ in range(2)]


def cancelling():
    @mb.program(input_specs=[mb.TensorSpec(shape=SHAPE)])
    def prog(x):
        scaled = mb.mul(x=x, y=np.float32(5000.0), name="scaled")
        centred = mb.add(x=scaled, y=np.float32(-50025.0), name="centred")  # the folded norm's bias
        return mb.mul(x=centred, y=np.float32(0.01), name="out")
    return prog


def well_conditioned():
    @mb.program(input_specs=[mb.TensorSpec(shape=SHAPE)])
    def prog(x):
        return mb.mul(x=mb.sigmoid(x=x, name="gate"), y=np.float32(3.0), name="out")
    return prog


def saved(tmp_path, make, cosine_min):
    record = {}

    def before_cast(program):
        record["guard"] = guard = fp16_guard.find_overflows(program, SAMPLES, cosine_min=cosine_min)
        return guard.keep_fp32

    result = ConvertResult(program=make(), input_names={"x": "x"}, output_names={"out": "out"},
                           input_shapes={"x": SHAPE})
    model = save_mlpackage(result, tmp_path / "m.mlpackage", target="iOS17", precision="float16", metadata={},
                           before_fp16_cast=before_cast, consume=True)
    return model._mil_program, record["guard"]


def artifact_cosine(program, make) -> float:
    return worst_cosine([run_program(make(), s) for s in SAMPLES], [run_program(program, s) for s in SAMPLES])


def test_cancelling_bias_fails_in_fp16_and_the_guard_keeps_it_fp32(tmp_path):
    plain, unguarded = saved(tmp_path / "plain", cancelling, None)
    assert unguarded.precision is None and not unguarded.keep_fp32
    assert artifact_cosine(plain, cancelling) < 0.999  # the failure mode itself

    program, guard = saved(tmp_path / "guarded", cancelling, 0.999)
    precision = guard.precision
    assert precision.fp16_cosine < 0.999 <= precision.kept_cosine
    assert {"scaled", "centred"} <= set(precision.kept) and "out" not in precision.kept
    assert precision.kinds() == {"mul": 1, "add": 1}
    assert artifact_cosine(program, cancelling) >= 0.999
    assert guard.to_json()["precision"]["kept_fp32"] == ["scaled", "centred"]
    warning = _precision_warning(guard)
    assert "2 ops (1 mul, 1 add) are kept in fp32" in warning and "scaled, centred" in warning


def test_a_program_fp16_holds_keeps_nothing(tmp_path):
    _, guard = saved(tmp_path, well_conditioned, 0.999)
    assert guard.precision.kept == {} and guard.precision.fp16_cosine > 0.9995
    assert _precision_warning(guard) is None


def test_ane_only_cannot_hold_precision_islands():
    found = PrecisionResult(cosine_min=0.999, fp16_cosine=0.98, kept_cosine=0.9999, kept={"scaled": "mul"})
    _refuse_precision_islands_on_ane(found, "cpu_and_ne")  # the CPU holds them
    with pytest.raises(BuildError, match=r"estimated cosine of 0\.980000.*1 ops \(1 mul\).*ane_only") as caught:
        _refuse_precision_islands_on_ane(found, "ane_only")
    assert "cpu_and_ne" in caught.value.hint


def test_segments_cover_every_op_once_in_order():
    ops = list(range(37))
    runs = segments_of(ops, 16)
    assert len(runs) == 16 and [op for run in runs for op in run] == ops
    assert segments_of(ops[:3], 16) == [[0], [1], [2]]


def test_the_guard_holds_the_recipes_strictest_cosine_min():
    from edgebuild.plugin.validation import ValidateSection
    from edgebuild_coreml.stages import strictest_cosine_min

    assert strictest_cosine_min(None) is None
    assert strictest_cosine_min(ValidateSection(thresholds={"max_abs_max": 0.1})) is None
    section = ValidateSection(thresholds={"cosine_min": 0.99}, per_output={"logits": {"thresholds": {"cosine_min": 0.999}}})
    assert strictest_cosine_min(section) == pytest.approx(0.999)


def moving():
    """A product, then ops that only move its values (and a relu), then another product."""
    @mb.program(input_specs=[mb.TensorSpec(shape=SHAPE)])
    def prog(x):
        scaled = mb.mul(x=x, y=np.float32(1.2345), name="scaled")
        moved = mb.transpose(x=mb.reshape(x=scaled, shape=[16, 16], name="square"), perm=[1, 0], name="turned")
        picked = mb.gather(x=moved, indices=np.array([3, 1, 4, 1, 5], np.int32), axis=0, name="picked")
        joined = mb.concat(values=[picked, mb.relu(x=picked, name="rectified")], axis=0, name="joined")
        return mb.mul(x=joined, y=np.float32(0.777), name="out")
    return prog


def test_values_on_fp16s_grid_are_not_rounded_again(monkeypatch):
    """An op that only moves fp16 values (reshape, transpose, gather, concat, relu) leaves them on
    fp16's grid: the emulation skips rounding them, with the very same outputs; after an op kept
    in fp32 they are off it and rounded."""
    from edgebuild_coreml import fp16_sensitivity
    from edgebuild_coreml.fp16_sensitivity import GRID_PRESERVING, emulated_fp16
    from edgebuild_coreml.interpreter import half_rounding

    rounded_ops = []
    original = half_rounding.round_to_half

    def counting(value):
        rounded_ops.append(value.shape)
        return original(value)

    monkeypatch.setattr(half_rounding, "round_to_half", counting)
    sample = SAMPLES[0]
    skipped = emulated_fp16(moving(), sample, set())
    rounds_skipping = len(rounded_ops)
    monkeypatch.setattr(fp16_sensitivity, "GRID_PRESERVING", frozenset())
    rounded_ops.clear()
    every = emulated_fp16(moving(), sample, set())
    assert rounds_skipping == len(rounded_ops) - 5  # square, turned, picked, rectified, joined
    np.testing.assert_array_equal(skipped["out"], every["out"])

    # picked kept and read by a kept op: fp32, so the relu reading it is rounded though it only moves
    monkeypatch.setattr(fp16_sensitivity, "GRID_PRESERVING", GRID_PRESERVING)
    rounded_ops.clear()
    emulated_fp16(moving(), sample, {"picked", "joined"})
    assert len(rounded_ops) == 5  # the input, scaled, rectified, joined (fp16 ops read it), out
