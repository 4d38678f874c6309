"""The lowering pipeline's division pass: ``x / c`` becomes ``x * (1 / c)`` except where the quotient
is rounded (a quantiser), where the product by the reciprocal would land ties one step away from
onnxruntime's division, or is the scale of such a quotient (DynamicQuantizeLinear's range / 255),
where it would move the scale, and every value dequantised with it, by an ulp."""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY
from edgebuild_coreml.interpreter import run_program
from edgebuild_coreml.lowering.passes import RECIPROCAL_PASS, lowering_passes
from interpreter_programs import spec
from onnx_cases import lower, run_onnxruntime, single_node_model

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


def _quantised_with_passes(model, x: np.ndarray) -> list[np.ndarray]:
    """The lowered model after the division pass, run in the interpreter: outputs in ONNX order."""
    lowered = lower(model)
    PASS_REGISTRY[RECIPROCAL_PASS](lowered.program)
    outputs = run_program(lowered.program, {lowered.input_names["x"]: x})
    return [outputs[lowered.output_names[name]] for name in ("y0", "y1", "y2")]


def test_a_dynamic_quantisers_scale_stays_a_division_and_equals_onnxruntimes():
    rng = np.random.default_rng(3)
    samples = [rng.normal(scale=rng.uniform(0.1, 8), size=(4, 96)).astype(np.float32) for _ in range(16)]
    ranges = [np.float32(max(x.max(), 0) - min(x.min(), 0)) for x in samples]
    # the case: for most of these ranges the product by 1/255 is another float than the quotient
    assert sum(r * (np.float32(1) / np.float32(255)) != r / np.float32(255) for r in ranges) >= 4
    model = single_node_model("DynamicQuantizeLinear", {"x": samples[0]}, outputs=3)
    for x in samples:
        quantised, scale, zero_point = _quantised_with_passes(model, x)
        expected = run_onnxruntime(model, {"x": x})
        np.testing.assert_array_equal(np.asarray(scale).reshape(()), expected["y1"])
        np.testing.assert_array_equal(np.asarray(zero_point).reshape(()), expected["y2"])
        np.testing.assert_array_equal(quantised, expected["y0"])
