"""W8A8: activation ranges calibrated by the MIL interpreter, quantised by coremltools' passes."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import coremltools as ct
from coremltools.converters.mil import Builder as mb

from edgebuild.errors import RecipeError
from edgebuild_coreml.compress.activations import (
    calibrate_activation_ranges,
    quantize_activations,
    share_concat_ranges,
)
from edgebuild_coreml.compress.apply import compress_mlpackage
from edgebuild_coreml.compress.config import validate_compression
from edgebuild_coreml.compress.program import is_weight_op, iter_ops, load_program
from edgebuild_coreml.interpreter import run_program

RNG = np.random.default_rng(7)
CONV1_W = (RNG.standard_normal((32, 16, 3, 3)) * 0.1).astype(np.float32)
CONV2_W = (RNG.standard_normal((32, 32, 3, 3)) * 0.06).astype(np.float32)
FC_W = (RNG.standard_normal((10, 32 * 4 * 4)) * 0.03).astype(np.float32)
SAMPLES = [{"x": RNG.standard_normal((1, 16, 8, 8)).astype(np.float32) * (1 + i)} for i in range(4)]


def _residual_program():
    """conv -> relu -> conv -> add(residual) -> relu -> max_pool -> linear; weights above 2048."""

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 16, 8, 8))], opset_version=ct.target.iOS17)
    def program(x):
        a = mb.relu(x=mb.conv(x=x, weight=CONV1_W, pad_type="same", name="conv1"), name="relu1")
        b = mb.conv(x=a, weight=CONV2_W, pad_type="same", name="conv2")
        y = mb.relu(x=mb.add(x=a, y=b, name="residual"), name="relu2")
        y = mb.max_pool(x=y, kernel_sizes=[2, 2], strides=[2, 2], pad_type="valid", name="pool")
        return mb.linear(x=mb.reshape(x=y, shape=[1, -1]), weight=FC_W, name="fc")

    return program


def _convert(program, precision):
    return ct.convert(
        program,
        convert_to="mlprogram",
        minimum_deployment_target=ct.target.iOS17,
        compute_precision=precision,
        skip_model_load=True,
    )


@pytest.fixture(scope="module")
def residual_package(tmp_path_factory):
    path = tmp_path_factory.mktemp("w8a8") / "residual.mlpackage"
    _convert(_residual_program(), ct.precision.FLOAT16).save(str(path))
    return path


@pytest.fixture(scope="module")
def w8a8(residual_package, tmp_path_factory):
    dst = tmp_path_factory.mktemp("w8a8out") / "w8a8.mlpackage"
    section = {"weights": {"mode": "linear", "dtype": "int8"}, "activations": {"mode": "linear"}}
    report = compress_mlpackage(residual_package, dst, validate_compression(section, target="iOS17"),
                                calibration=SAMPLES)
    return report, load_program(ct.models.MLModel(str(dst), skip_model_load=True))


def _compute_op(program, prefix):
    return next(op for op in iter_ops(program) if op.name.startswith(prefix) and not is_weight_op(op))


def _numpy_conv_same(x, weight):
    """3x3 stride-1 'same' convolution in float64, independent of the interpreter."""
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))  # n c h w kh kw
    return np.einsum("nchwij,ocij->nohw", windows, weight.astype(np.float64))


def test_activations_become_int8_quantize_dequantize_pairs(w8a8):
    _, program = w8a8
    ops = list(iter_ops(program))
    quantize = [op for op in ops if op.op_type == "quantize"]
    assert quantize and all(op.outputs[0].dtype.get_bitwidth() == 8 for op in quantize)
    assert {op.output_dtype.val for op in quantize} == {"int8"}
    # Every conv/linear and both operands of the residual add read a dequantised int8 tensor.
    for prefix, operands in (("conv1", ["x"]), ("conv2", ["x"]), ("fc", ["x"]), ("residual", ["x", "y"])):
        op = _compute_op(program, prefix)
        for name in operands:
            assert op.inputs[name].op.op_type == "dequantize", (prefix, name)


def test_weights_are_int8_constexprs(w8a8):
    report, program = w8a8
    for prefix in ("conv1", "conv2", "fc"):
        producer = _compute_op(program, prefix).inputs["weight"].op
        assert producer.op_type in ("constexpr_affine_dequantize", "constexpr_blockwise_shift_scale")
        data = producer.inputs.get("quantized_data", producer.inputs.get("data"))
        assert data.dtype.get_bitwidth() == 8
    entries = {w["name"].split(".")[0]: w for w in report["weights"] if w["name"].endswith(".weight")}
    assert all(w["mode"] == "linear" for w in entries.values())
    # fp16 -> int8 halves the weights (plus a per-channel scale).
    assert report["bytes_after"] < 0.6 * report["bytes_before"]


def test_w8a8_output_stays_close_to_float(residual_package, w8a8):
    _, program = w8a8
    reference = _convert(_residual_program(), ct.precision.FLOAT32)
    reference_program = load_program(reference)
    for sample in SAMPLES:
        expected = next(iter(run_program(reference_program, sample).values())).ravel().astype(np.float64)
        got = next(iter(run_program(program, sample).values())).ravel().astype(np.float64)
        cosine = expected @ got / (np.linalg.norm(expected) * np.linalg.norm(got))
        assert cosine >= 0.99


def test_calibration_ranges_are_the_observed_min_and_max(residual_package):
    program = load_program(ct.models.MLModel(str(residual_package), skip_model_load=True))
    stats = calibrate_activation_ranges(program, SAMPLES)
    inputs = np.stack([s["x"] for s in SAMPLES])
    assert stats["x"] == {"rmin": float(inputs.min()), "rmax": float(inputs.max())}
    # relu(conv1(x)) over all samples, computed in float64 without the interpreter.
    relu1 = np.maximum(np.concatenate([_numpy_conv_same(s["x"], CONV1_W) for s in SAMPLES]), 0)
    relu1_var = _compute_op(program, "relu1").outputs[0].name
    assert stats[relu1_var]["rmin"] == 0.0
    assert stats[relu1_var]["rmax"] == pytest.approx(relu1.max(), rel=2e-3)  # fp16 activations
    # The range spans every sample (scaled 1x..4x), not only the last one as coremltools' helper keeps.
    conv1 = np.concatenate([_numpy_conv_same(s["x"], CONV1_W) for s in SAMPLES])
    conv1_var = _compute_op(program, "conv1").outputs[0].name
    assert stats[conv1_var]["rmin"] == pytest.approx(conv1.min(), rel=2e-3)
    assert stats[conv1_var]["rmax"] == pytest.approx(conv1.max(), rel=2e-3)


def test_quantize_scale_follows_calibrated_range(w8a8):
    _, program = w8a8
    first_quantize = _compute_op(program, "conv1").inputs["x"].op.inputs["input"].op
    assert first_quantize.op_type == "quantize"
    inputs = np.stack([s["x"] for s in SAMPLES])
    # linear_symmetric int8: scale = max |value| / 127, stored in fp16
    assert float(first_quantize.scale.val) == pytest.approx(np.abs(inputs).max() / 127, rel=1e-3)


def test_concat_inputs_and_output_share_one_range():
    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 4)), mb.TensorSpec(shape=(1, 4))],
                opset_version=ct.target.iOS17)
    def program(a, b):
        return mb.concat(values=[mb.relu(x=a, name="ra"), mb.relu(x=b, name="rb")], axis=1, name="cat")

    samples = [{"a": np.array([[0.0, 1.0, 2.0, 3.0]], np.float32), "b": np.array([[5.0, 0.0, 9.0, 1.0]], np.float32)}]
    stats = calibrate_activation_ranges(program, samples)
    assert stats["ra"]["rmax"] == 3.0 and stats["rb"]["rmax"] == 9.0
    share_concat_ranges(program, stats)
    assert {stats[name]["rmax"] for name in ("ra", "rb", "cat")} == {9.0}
    assert {stats[name]["rmin"] for name in ("ra", "rb", "cat")} == {0.0}


def test_activation_quantisation_needs_samples(residual_package):
    model = ct.models.MLModel(str(residual_package), skip_model_load=True)
    with pytest.raises(RecipeError, match="calibration samples"):
        quantize_activations(model, [], source=residual_package)
    with pytest.raises(RecipeError, match="lacks input"):
        quantize_activations(model, [{"y": SAMPLES[0]["x"]}], source=residual_package)


def test_float32_activations_are_refused_with_a_hint():
    model = _convert(_residual_program(), ct.precision.FLOAT32)
    with pytest.raises(RecipeError, match="float16") as error:
        quantize_activations(model, SAMPLES[:1], source="residual")
    assert "conv1" in str(error.value)


TINY_RECIPE = """\
edgebuild: 1
name: w8a8_tiny
source:
  model: tiny.onnx
  inputs: {{x: {{shape: [1, 8, 6, 6], dtype: float32}}}}
target: {{backend: coreml, deployment_target: iOS17, precision: float16}}
compression:
  weights: {{mode: linear, dtype: int8}}
  weight_threshold: 512
  activations: {{mode: linear, dtype: int8}}
validate:
  samples: 4
  inputs: {{x: {{random: {{low: -1.0, high: 1.0, seed: 0}}}}}}
  thresholds: {{cosine_min: {cosine_min}}}
outputs: {{dir: out}}
"""


def _tiny_onnx(path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    weight = (rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32)
    fc = (rng.standard_normal((16 * 4 * 4, 10)) * 0.05).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("Flatten", ["r"], ["f"]),
            helper.make_node("MatMul", ["f", "fc"], ["y"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        initializer=[numpy_helper.from_array(weight, "w"), numpy_helper.from_array(fc, "fc")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))


def _run_recipe(tmp_path, cosine_min):
    _tiny_onnx(tmp_path / "tiny.onnx")
    recipe = tmp_path / "w8a8.yaml"
    recipe.write_text(TINY_RECIPE.format(cosine_min=cosine_min))
    env = {**os.environ, "EDGEBUILD_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-m", "edgebuild.cli.app", "run", str(recipe), "--json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_recipe_builds_w8a8_package_on_linux(tmp_path):
    done = _run_recipe(tmp_path, 0.99)
    assert done.returncode == 0, done.stderr[-3000:]
    (variant,) = json.loads(done.stdout)["variants"]
    assert variant["status"] == "built"
    package = next((tmp_path / "out").rglob("*.mlpackage"))
    program = load_program(ct.models.MLModel(str(package), skip_model_load=True))
    op_types = [op.op_type for op in iter_ops(program)]
    assert "quantize" in op_types and "dequantize" in op_types
    assert "constexpr_affine_dequantize" in op_types or "constexpr_blockwise_shift_scale" in op_types


def test_float32_recipe_with_activation_quantisation_is_a_recipe_error_with_its_line(tmp_path):
    _tiny_onnx(tmp_path / "tiny.onnx")
    recipe = tmp_path / "w8a8.yaml"
    recipe.write_text(TINY_RECIPE.format(cosine_min=0.99).replace("precision: float16", "precision: float32"))
    env = {**os.environ, "EDGEBUILD_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "edgebuild.cli.app", "validate", str(recipe)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "w8a8.yaml:8:3 compression:" in done.stderr
    assert "needs float16 activations" in done.stderr and "precision: float16" in done.stderr
    assert "Traceback" not in done.stderr
