"""The memory-lean parts of the fp16 guard and the lowering: same answers as the plain versions."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnx_ir as ir
import pytest
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil.passes.defs.quantization import FP16ComputePrecision
import onnxruntime as ort
from onnx_cases import IR_VERSION

from edgebuild_coreml import fp16_guard
from edgebuild_coreml.interpreter import run_program
from edgebuild_coreml.lowering.converter import ConvertResult, convert
from edgebuild_coreml.lowering.package import guarded_fp16_cast, save_mlpackage


def _reference_max(array: np.ndarray, below: float = np.inf) -> float:
    magnitudes = np.abs(array.astype(np.float64)).ravel()
    kept = magnitudes[np.isfinite(magnitudes) & (magnitudes < below)]
    return float(kept.max()) if kept.size else 0.0


@pytest.mark.parametrize("size", [1, 7, fp16_guard.SCAN_CHUNK + 3])
def test_chunked_magnitude_matches_numpy_across_chunk_edges(size):
    rng = np.random.default_rng(size)
    array = rng.standard_normal(size).astype(np.float32) * 100
    array[-1] = -7e4  # the largest value sits in the last chunk
    if size > 2:
        array[0], array[1] = np.inf, np.nan
    assert fp16_guard.max_finite_magnitude(array) == _reference_max(array)
    assert fp16_guard.max_finite_magnitude(np.full(3, np.inf, np.float32)) == 0.0
    huge = np.array([-3.4e38, 2e5, 5.0], np.float32)
    assert fp16_guard.max_finite_magnitude(huge, below=1e38) == _reference_max(huge, below=1e38) == 2e5


@pytest.mark.parametrize("value", [
    np.array([1.0, -70000.0], np.float32),  # a real value fp16 cannot hold
    np.array([-3.4e38, 10.0], np.float32),  # meant as infinity: fine to become fp16's inf
    np.array([np.inf, np.nan, 3.0], np.float32),
    np.float32(65504.0),
])
def test_overflow_check_agrees_with_coremltools(value):
    @mb.program(input_specs=[mb.TensorSpec(shape=np.shape(value) or (1,))])
    def prog(x):
        return mb.add(x=x, y=value, name="sum")

    [op] = [op for op in prog.functions["main"].operations if op.name == "sum"]
    assert guarded_fp16_cast.fp16_overflow(op) == FP16ComputePrecision.fp16_overflow(op)


def _branchy_program():
    """A value (``wide``) read again long after it was made, and by the function's outputs."""

    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 3))])
    def prog(x):
        wide = mb.mul(x=x, y=np.float32(1e3), name="wide")
        a = mb.relu(x=wide, name="a")
        b = mb.sqrt(x=a, name="b")
        c = mb.add(x=b, y=wide, name="c")
        return c, wide

    return prog


def test_ranges_with_released_values_match_the_plain_interpreter():
    prog = _branchy_program()
    samples = [{"x": np.array([[0.5, -2.0, 3.0], [80.0, 0.1, -1.0]], np.float32)},
               {"x": np.full((2, 3), 90.0, np.float32)}]
    expected: dict[str, float] = {}
    for sample in samples:
        run_program(prog, sample, observer=lambda op, outs: expected.__setitem__(
            op.name, max(expected.get(op.name, 0.0), float(np.abs(outs[0]).max()))))
    assert fp16_guard.activation_ranges(prog, samples) == pytest.approx(expected, rel=1e-7)
    # The run leaves the program usable: outputs are never released.
    out = run_program(prog, samples[0])
    np.testing.assert_allclose(out["wide"], samples[0]["x"] * 1e3, rtol=1e-6)


def test_guard_hook_sees_the_program_the_fp16_pass_casts(tmp_path):
    """``before_fp16_cast`` runs once, on an fp32 program, and the ops it names stay fp32."""
    prog = _branchy_program()
    seen = []

    def hook(program):
        dtypes = {op.name: op.outputs[0].dtype.__name__ for op in program.functions["main"].operations
                  if op.op_type != "const"}
        seen.append(dtypes)
        return {"c"}

    result = ConvertResult(program=prog, input_names={"x": "x"}, output_names={"c": "c", "wide": "wide"},
                           input_shapes={"x": (2, 3)})
    model = save_mlpackage(result, tmp_path / "m.mlpackage", target="iOS17", precision="float16", metadata={},
                           before_fp16_cast=hook, consume=True)
    assert len(seen) == 1 and set(seen[0].values()) == {"fp32"}
    saved = model._mil_program.functions["main"].operations
    assert fp16_guard.ops_not_fp32(model._mil_program, ["c"]) == []
    assert [op.outputs[0].dtype.__name__ for op in saved if op.op_type == "sqrt"] == ["fp16"]  # not kept


def test_converter_unmaps_external_weights_and_still_matches_onnxruntime(tmp_path):
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((64, 64)).astype(np.float32)
    w2 = rng.standard_normal((64, 8)).astype(np.float32)
    graph = oh.make_graph(
        [oh.make_node("MatMul", ["x", "w1"], ["h"]), oh.make_node("Relu", ["h"], ["r"]),
         oh.make_node("MatMul", ["r", "w2"], ["y"])],
        "g", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 64])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 8])],
        [onh.from_array(w1, "w1"), onh.from_array(w2, "w2")])
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=IR_VERSION)
    path = tmp_path / "m.onnx"
    onnx.save(proto, path, save_as_external_data=True, all_tensors_to_one_file=True, location="m.data",
              size_threshold=0)
    model = ir.load(path)
    result = convert(model, target="iOS17", precision="float32")
    tensors = [value.const_value for value in model.graph.initializers.values()]
    assert all(isinstance(t, ir.ExternalTensor) and t.raw is None for t in tensors)  # unmapped
    x = rng.standard_normal((2, 64)).astype(np.float32)
    (reference,) = ort.InferenceSession(str(path)).run(None, {"x": x})
    (candidate,) = run_program(result.program, {"x": x}).values()
    np.testing.assert_allclose(candidate, reference, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(tensors[0].numpy(), w1)  # a released weight reloads on demand
