"""The lowering pipeline's division pass: ``x / c`` becomes ``x * (1 / c)`` except where the quotient
is rounded (a quantiser), where the product by the reciprocal would land ties one step away from
onnxruntime's division."""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY
from edgebuild_coreml.interpreter import run_program
from edgebuild_coreml.lowering.passes import RECIPROCAL_PASS, lowering_passes
from interpreter_programs import spec

SCALE = np.float32(0.0123)


def _program():
    @mb.program(input_specs=[spec((64,))])
    def prog(x):
        quantised = mb.round(x=mb.real_div(x=x, y=SCALE, name="over_scale"), name="rounded")
        scaled = mb.relu(x=mb.real_div(x=x, y=np.float32(4.0), name="quarter"), name="relu")
        return quantised, scaled

    return prog


def _ties() -> np.ndarray:
    """Values halfway between two quantisation steps, as float32 gives them."""
    steps = np.arange(-32, 32, dtype=np.float32) + np.float32(0.5)
    return steps * SCALE


def test_a_rounded_quotient_stays_a_division_and_any_other_becomes_a_product():
    prog = _program()
    PASS_REGISTRY[RECIPROCAL_PASS](prog)
    ops = {op.name: op.op_type for op in prog.functions["main"].operations}
    assert ops["over_scale"] == "real_div"
    assert "quarter" not in ops and ops["_inversed_quarter"] == "mul"


def test_a_quantisers_ties_round_as_the_division_does():
    x = _ties()
    reciprocal = np.round(x * (np.float32(1) / SCALE))
    assert (reciprocal != np.round(x / SCALE)).any()  # the case: the product rounds some ties otherwise
    prog = _program()
    PASS_REGISTRY[RECIPROCAL_PASS](prog)
    outputs = run_program(prog, {"x": x})
    rounded = next(v for k, v in outputs.items() if k.startswith("rounded"))
    np.testing.assert_array_equal(rounded, np.round(x / SCALE))


def test_every_precision_runs_it_in_place_of_coremltools_own():
    for precision in ("float32", "float16"):
        passes = lowering_passes(precision)
        assert RECIPROCAL_PASS in passes and "common::divide_to_multiply" not in passes
