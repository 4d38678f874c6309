"""fp32 values rounded to fp16's grid in fp32 (``interpreter.half_rounding``): to nearest, bit for
bit as a cast to fp16 and back; stochastically, to a neighbour with the chance that keeps the mean."""

from __future__ import annotations

import numpy as np
import pytest
from edgebuild_coreml.interpreter.half_rounding import fp16_spacing, round_to_half, stochastic_round_to_half


def every_kind_of_float() -> np.ndarray:
    """Random bit patterns (every exponent, NaNs and infs among them) and runs of consecutive floats
    around fp16's edges: the subnormals' bottom, the smallest normal, the largest finite value, inf."""
    rng = np.random.default_rng(3)
    edges = [0x33000000, 0x38000000 - (1 << 16), 0x477FE000, 0x7F7FF000]
    bits = np.concatenate([rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32),
                           *(np.arange(edge, edge + (1 << 17), dtype=np.uint32) for edge in edges)])
    return np.concatenate([bits, bits | np.uint32(1 << 31)]).view(np.float32)


def cast_round(values: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return values.astype(np.float16).astype(np.float32)


def test_nearest_is_a_cast_there_and_back_bit_for_bit():
    values = every_kind_of_float()
    got, want = round_to_half(values), cast_round(values)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))  # -0.0 included


def test_every_fp16_value_and_every_midpoint_round_as_a_cast_rounds_them():
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    finite = np.sort(halves[np.isfinite(halves)].astype(np.float32))
    midpoints = (finite[:-1].astype(np.float64) + finite[1:]) / 2  # ties: to the even neighbour
    for values in (finite, midpoints.astype(np.float32)):
        np.testing.assert_array_equal(round_to_half(values), cast_round(values))


@pytest.mark.parametrize("layout", ["channels_last", "transposed", "strided", "scalar"])
def test_any_layout_is_rounded_and_left_unchanged(layout):
    maps = (np.random.default_rng(1).standard_normal((2, 8, 6, 5)) * 100).astype(np.float32)
    view = {"channels_last": np.ascontiguousarray(maps.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2),
            "transposed": maps.transpose(0, 1, 3, 2), "strided": maps[:, ::3, 1::2],
            "scalar": maps[0, 0, 0, 0].reshape(())}[layout]
    before = view.copy()
    got = round_to_half(view)
    assert got.shape == view.shape and np.array_equal(view, before)
    np.testing.assert_array_equal(got, cast_round(view))
    drawn = stochastic_round_to_half(view, np.random.default_rng(0))
    assert drawn.shape == view.shape and np.array_equal(view, before)
    if layout == "channels_last":  # the kernels pick their channels-last paths by the layout
        assert got.transpose(0, 2, 3, 1).flags.c_contiguous and drawn.transpose(0, 2, 3, 1).flags.c_contiguous


def test_spacing_is_fp16s_distance_to_the_next_value_up():
    halves = np.arange(1 << 15, dtype=np.uint16).view(np.float16)  # the positive ones
    finite = halves[np.isfinite(halves)][:-1]  # all but the largest, whose next value up is inf
    up = np.nextafter(finite, np.float16(np.inf)).astype(np.float32) - finite.astype(np.float32)
    np.testing.assert_array_equal(fp16_spacing(finite.astype(np.float32)), up)


def test_stochastic_rounding_picks_a_neighbour_with_the_chance_that_keeps_the_mean():
    rng = np.random.default_rng(5)
    values = (rng.standard_normal(200) * 10.0 ** rng.integers(-7, 4, 200)).astype(np.float32)
    repeated = np.repeat(values, 4000)
    drawn = stochastic_round_to_half(repeated, np.random.default_rng(0)).reshape(200, 4000)
    below = np.where(cast_round(values) <= values, cast_round(values),
                     np.nextafter(values.astype(np.float16), np.float16(-np.inf)).astype(np.float32))
    above = below + fp16_spacing(below)
    assert np.all((drawn == below[:, None]) | (drawn == above[:, None]))
    chance = np.where(above > below, (values - below) / (above - below), 0.0)
    assert np.all(np.abs((drawn == above[:, None]).mean(axis=1) - chance) < 0.05)  # 4000 draws: sd <= 0.008


def test_stochastic_rounding_of_values_a_cast_overflows_or_keeps_nan_is_the_cast():
    values = np.array([65504.0, 65510.0, -65519.0, 65520.0, 1e6, -np.inf, np.nan, 0.0, -0.0], np.float32)
    got = stochastic_round_to_half(values, np.random.default_rng(0))
    np.testing.assert_array_equal(got, cast_round(values))
    assert np.signbit(got[-1])
    tiny = np.full(1000, -1e-9, np.float32)  # below fp16's smallest subnormal: -0.0 or -2**-24
    assert np.all(np.signbit(stochastic_round_to_half(tiny, np.random.default_rng(0))))


def test_stochastic_rounding_on_the_bits_and_below_fp16s_normals_agree_in_distribution():
    """The two paths meet at fp16's smallest normal, 2**-14: just below it the spacing is fixed
    (2**-24), just above it is the same, so both sides pick the upper neighbour as often."""
    below = np.full(20000, np.float32(2.0**-14) - np.float32(2.0**-26), np.float32)  # 3/4 of a step above
    above = np.full(20000, np.float32(2.0**-14) + np.float32(2.0**-26), np.float32)  # 1/4 of a step above
    rng = np.random.default_rng(2)
    up_below = (stochastic_round_to_half(below, rng) > below).mean()
    up_above = (stochastic_round_to_half(above, rng) > above).mean()
    assert abs(up_below - 0.75) < 0.02 and abs(up_above - 0.25) < 0.02
