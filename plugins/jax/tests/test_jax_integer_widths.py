"""The stablehlo suite's integer cases: every width, the values that exercise each primitive, and
every case through the Core ML lowering in the MIL interpreter, exact against JAX."""

import numpy as np
import pytest

pytest.importorskip("jax")

from edgebuild_jax import conformance  # noqa: E402
from edgebuild_jax.conformance_integers import INTEGERS, carried_range  # noqa: E402

SHIFTS = ["shift_left", "shift_right_logical", "shift_right_arithmetic"]
OTHERS = ["add", "sub", "mul", "div", "rem", "max", "min", "bitwise_and", "bitwise_or", "bitwise_xor",
          "bitwise_not", "eq", "ne", "lt", "le", "gt", "ge", "convert_element_type"]
NAMES = [np.dtype(d).name for d in INTEGERS]


def _integer_cases(primitives):
    """(index, variant) of the cases of ``primitives`` whose inputs are all integers."""
    return [(i, v) for i, v in enumerate(conformance._variants())
            if v[0] in primitives and all(np.dtype(spec[1]).kind in "iu" for spec in v[3])]


def test_every_shift_covers_every_integer_type():
    for primitive in SHIFTS:
        assert sorted(v for _, (p, v, _, _) in _integer_cases({primitive})) == sorted(NAMES)


def test_the_other_integer_primitives_cover_the_widths_the_general_cases_lack():
    by_primitive = {}
    for _, (primitive, variant, _, _) in _integer_cases(set(OTHERS) - {"convert_element_type"}):
        by_primitive.setdefault(primitive, set()).add(variant)
    for primitive in set(OTHERS) - {"convert_element_type", "bitwise_not"}:
        assert by_primitive[primitive] >= set(NAMES) - {"int32"}, primitive
    conversions = {v for _, (p, v, _, _) in _integer_cases({"convert_element_type"})}
    assert {f"{a}_to_{b}" for a in NAMES for b in NAMES if a != b} <= conversions


@pytest.mark.parametrize("dtype", INTEGERS, ids=NAMES)
def test_shift_amounts_reach_past_the_width_and_below_zero(dtype):
    for index, (primitive, variant, fn, specs) in _integer_cases(set(SHIFTS)):
        if variant != np.dtype(dtype).name:
            continue
        values, amounts = conformance._arrays(index, *specs)
        width = np.iinfo(dtype).bits
        as_int = amounts.astype(np.int64)
        assert (as_int >= width).any() and (as_int == 0).any() and ((as_int > 0) & (as_int < width)).any()
        if np.iinfo(dtype).kind == "i":
            assert (as_int < 0).any()
            if not (primitive == "shift_right_logical" and width == 64):  # its results would pass 2**31
                assert (values < 0).any()
        low, high = carried_range(dtype)
        assert values.astype(np.int64).min() >= low and values.astype(np.int64).max() <= high


def _run(ops):
    from edgebuild.conformance.suite import run_suite

    result = run_suite("stablehlo", "coreml", ops, jobs=1)
    failures = [c for c in result["cases"] if c["status"] != "pass"]
    return result, failures


def test_every_shift_passes_exactly_through_the_core_ml_lowering():
    result, failures = _run(SHIFTS)
    assert result["total"] == 3 * len(INTEGERS) and not failures, failures


@pytest.mark.slow  # about 220 cases
def test_the_other_integer_primitives_pass_exactly_through_the_core_ml_lowering():
    result, failures = _run(OTHERS)
    assert not failures, failures
    assert all(c["status"] == "pass" for c in result["cases"])  # none set aside as beyond int32
