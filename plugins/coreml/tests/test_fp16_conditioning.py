"""The fp16 guard's estimate redrawn: a net whose fp16 result rounding alone decides is named, not trusted.

The ill-conditioned case is a chaotic map (the logistic map at r = 3.99, twenty steps) on a
two-element state: any last-bit difference grows about twofold a step, and a two-element output
leaves no average to smooth it. Round-to-nearest meets the budget with some ops kept, but a
stochastic rounding of the same step lands far from it, and no island set within the guard's cap
holds those: the estimate is one draw of a chaotic quantity. Well-conditioned programs (contracting maps, a gate, the cancelling bias
the search fixes) spread by about their own deficit and raise nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml import fp16_guard
from edgebuild_coreml.fp16_sensitivity import PrecisionResult, stochastic_rounding
from edgebuild.dag.validate_stage import with_stage_notes
from edgebuild.stage import Result, StageInputs
from edgebuild_coreml.lower import _conditioning_note, _conditioning_warning

COSINE_MIN = 0.999


def logistic(width: int, steps: int, rate: float):
    """``steps`` of x -> rate * x * (1 - x) on a [1, width] state: chaotic at 3.99, contracting at 2.5."""
    @mb.program(input_specs=[mb.TensorSpec(shape=(1, width))])
    def prog(x):
        value = x
        for step in range(steps):
            grown = mb.mul(x=value, y=np.float32(rate), name=f"grown{step}")
            value = mb.mul(x=grown, y=mb.sub(x=np.float32(1.0), y=value, name=f"left{step}"), name=f"state{step}")
        return mb.mul(x=value, y=np.float32(1.0), name="out")
    return prog


def gate(width: int, steps: int, rate: float):
    @mb.program(input_specs=[mb.TensorSpec(shape=(1, width))])
    def prog(x):
        return mb.mul(x=mb.sigmoid(x=x, name="gate"), y=np.float32(3.0), name="out")
    return prog


def guard_of(make, width: int, steps: int, rate: float, seed: int):
    rng = np.random.default_rng(seed)
    samples = [{"x": (0.2 + 0.6 * rng.random((1, width))).astype(np.float32)} for _ in range(2)]
    return fp16_guard.find_overflows(make(width, steps, rate), samples, cosine_min=COSINE_MIN)


@pytest.mark.parametrize("seed", [1, 2])
def test_a_chaotic_program_is_named_ill_conditioned(seed):
    guard = guard_of(logistic, 2, 20, 3.99, seed)
    precision = guard.precision
    low, high = precision.spread
    assert precision.kept and precision.kept_cosine >= 1 - (1 - COSINE_MIN) / 2  # nearest rounding met the budget...
    # ...but no island set within the cap holds it under the other roundings
    assert precision.capped_cosine < 1 - (1 - COSINE_MIN) / 2 and precision.ill_conditioned
    assert guard.to_json()["precision"]["ill_conditioned"] is True
    warning = _conditioning_warning(guard)
    assert f"vary between cosine {low:.6f} and {high:.6f} with the rounding alone" in warning
    assert "ill-conditioned in fp16" in warning and "float32" in warning and "cosine_min" in warning
    assert f"keeping up to {precision.cap} ops in fp32" in warning and f"{precision.capped_cosine:.6f}" in warning
    note = _conditioning_note(guard)
    assert f"between cosine {low:.6f} and {high:.6f}" in note and "ill-conditioned in fp16" in note


@pytest.mark.parametrize("make, width, steps, rate", [
    (logistic, 256, 4, 3.9),  # chaotic but short, with an average over many elements
    (logistic, 2, 20, 2.5),  # deep but contracting
    (logistic, 16, 10, 3.9),  # the search keeps ops, and the draws agree
    (gate, 256, 0, 0.0),
])
def test_well_conditioned_programs_raise_nothing(make, width, steps, rate):
    guard = guard_of(make, width, steps, rate, 0)
    precision = guard.precision
    low, high = precision.spread
    assert low <= precision.kept_cosine + 1e-12 and precision.kept_cosine <= high + 1e-12
    assert not precision.ill_conditioned and _conditioning_warning(guard) is None and _conditioning_note(guard) is None
    assert guard.to_json()["precision"]["ill_conditioned"] is False


@pytest.mark.parametrize("shape", [(), (1000,), (8, 64), (3, 5, 7)])
@pytest.mark.parametrize("scale", [1e-7, 1e-5, 1e-3, 1.0, 300.0, 30000.0])
def test_stochastic_rounding_picks_a_neighbour_and_is_unbiased(shape, scale):
    values = (np.random.default_rng(0).standard_normal(shape) * scale).astype(np.float32)
    rounded = stochastic_rounding(0)(values)
    with np.errstate(over="ignore"):  # beyond fp16's range both round to inf
        nearest = values.astype(np.float16)
    below = np.where(nearest.astype(np.float32) <= values, nearest, np.nextafter(nearest, np.float16(-np.inf)))
    above = np.where(nearest.astype(np.float32) >= values, nearest, np.nextafter(nearest, np.float16(np.inf)))
    assert rounded.dtype == np.float32 and rounded.shape == values.shape
    assert np.all((rounded == below.astype(np.float32)) | (rounded == above.astype(np.float32)))
    assert np.array_equal(rounded.astype(np.float16).astype(np.float32), rounded)  # fp16 values
    # many draws of one value average to it (round-to-nearest would keep its whole error)
    value = np.full(20000, values.ravel()[-1], np.float32)
    step = float(np.abs(np.spacing(value[:1].astype(np.float16)))[0])
    assert abs(float(stochastic_rounding(1)(value).mean()) - float(value[0])) < 0.05 * step


def test_a_strided_view_is_rounded_and_left_unchanged():
    values = (np.random.default_rng(2).standard_normal((6, 8)) * 10).astype(np.float32)
    view = values[::2, ::3].T
    before = view.copy()
    rounded = stochastic_rounding(0)(view)
    assert rounded.shape == view.shape and np.array_equal(view, before)
    assert np.all(np.abs(rounded - view) <= np.abs(np.spacing(view.astype(np.float16))).astype(np.float32))


def test_exact_and_non_finite_values_stay_as_nearest_rounds_them():
    values = np.array([0.0, -0.0, 1.0, -2.5, 2.0**-24, 65504.0, 65510.0, -65519.0, 65520.0, 1e6, -np.inf, np.nan],
                      np.float32)
    rounded = stochastic_rounding(0)(values)
    with np.errstate(over="ignore"):
        nearest = values.astype(np.float16).astype(np.float32)
    assert np.array_equal(rounded, nearest, equal_nan=True)


def test_the_spread_is_judged_against_the_whole_allowed_deficit():
    def result(low, high, cosine_min=0.999):
        return PrecisionResult(cosine_min=cosine_min, fp16_cosine=high, kept_cosine=high, spread=(low, high))
    assert not result(0.9992, 0.9999).ill_conditioned
    assert result(0.9985, 0.9999).ill_conditioned
    assert result(0.9985, 0.9999, cosine_min=0.99).ill_conditioned is False
    assert PrecisionResult(cosine_min=0.999, fp16_cosine=1.0, kept_cosine=1.0).ill_conditioned is False


def test_validation_failures_carry_the_lower_stages_note(tmp_path):
    def failure(output):
        return {"output": output, "metric": "cosine", "message": f"output '{output}': cosine 0.998 < cosine_min 0.999"}

    def record():
        return {"runtimes": {"interpreter": {"failures": [failure("a")]}, "coreml": {"failures": []}},
                "failures": [{"runtime": "interpreter", **failure("a")}, {"runtime": "coreml", **failure("b")}]}

    def result(name, info):
        return Result(name=name, key="k", digest="d", path=tmp_path, info=info, status="ran", seconds=0.0)

    note = "the lower stage found this model ill-conditioned in fp16"
    noted = StageInputs({"package": result("package", {}), "lower": result("lower", {"validation_note": note})})
    judged = with_stage_notes(record(), noted)
    messages = [f["message"] for f in judged["failures"]] + [f["message"] for f in
                                                              judged["runtimes"]["interpreter"]["failures"]]
    assert len(messages) == 3 and all(m.endswith("cosine_min 0.999; " + note) for m in messages)
    quiet = StageInputs({"lower": result("lower", {"warnings": ["x"]})})
    assert with_stage_notes(record(), quiet) == record()
