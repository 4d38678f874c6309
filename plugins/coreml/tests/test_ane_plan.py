"""Compute-unit policy: chip table, ANE eligibility rules, cost model, plan and ANE rewrites."""

from __future__ import annotations

import io

import coremltools as ct
import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types
from rich.console import Console

from edgebuild.errors import UsageError
from edgebuild_coreml.ane import cost as cost_model
from edgebuild_coreml.ane.chips import get_chip, load_chips
from edgebuild_coreml.ane.plan import NOTE, plan_program
from edgebuild_coreml.ane.rewrites import clamp_norm_epsilon, linear_to_conv, split_attention_heads
from edgebuild_coreml.ane.rules import eligibility, gpu_eligibility

IOS17 = ct.target.iOS17
RNG = np.random.default_rng(0)


def _ops(prog):
    return {op.name: op for op in prog.functions["main"].operations}


def _cnn_program(dtype=types.fp16):
    np_dtype = np.float16 if dtype == types.fp16 else np.float32

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 3, 224, 224), dtype=dtype)], opset_version=IOS17)
    def prog(x):
        y = mb.conv(x=x, weight=RNG.random((32, 3, 3, 3)).astype(np_dtype), strides=[2, 2],
                    pad_type="same", name="conv1")
        y = mb.batch_norm(x=y, mean=np.zeros(32, np_dtype), variance=np.ones(32, np_dtype),
                          gamma=np.ones(32, np_dtype), beta=np.zeros(32, np_dtype), name="bn1")
        y = mb.relu(x=y, name="relu1")
        y = mb.max_pool(x=y, kernel_sizes=[2, 2], strides=[2, 2], pad_type="valid", name="pool1")
        y = mb.conv(x=y, weight=RNG.random((64, 32, 3, 3)).astype(np_dtype), pad_type="same", name="conv2")
        y = mb.silu(x=y, name="act2")
        return mb.avg_pool(x=y, kernel_sizes=[2, 2], strides=[2, 2], pad_type="valid", name="pool2")

    return prog


# --- chip table -------------------------------------------------------------------------------

# Apple's published figures, as the issue states them (independent of chips.yaml).
APPLE_ANE_TOPS = {"a15": 15.8, "a16": 17, "a17_pro": 35, "a18_pro": 35, "m1": 11, "m2": 15.8, "m3": 18, "m4": 38}
APPLE_BANDWIDTH = {"m1": 68.25, "m1_max": 400, "m2": 100, "m3": 100, "m3_max": 400, "m4": 120}
GPU_FP32 = {"m1": 2.6, "m1_max": 10.4, "m2": 3.6, "m3": 4.1, "m4": 4.3}


def test_chip_table_has_required_chips_with_sources():
    chips = load_chips()
    required = {"m1", "m1_max", "m2", "m3", "m3_max", "m4", "a15", "a16", "a17_pro", "a18_pro"}
    assert required <= set(chips)
    for chip in chips.values():
        for figure in (chip.ane_tops, chip.gpu_fp32_tflops, chip.gpu_fp16_tflops, chip.bandwidth_gbs, chip.cpu_gflops):
            assert figure.value > 0
            assert "apple.com" in figure.source or figure.source.startswith("estimate"), figure.source


def test_chip_figures_match_published_values():
    chips = load_chips()
    for name, tops in APPLE_ANE_TOPS.items():
        assert chips[name].ane_tops.value == pytest.approx(tops)
    for name, gbs in APPLE_BANDWIDTH.items():
        assert chips[name].bandwidth_gbs.value == pytest.approx(gbs)
    for name, tflops in GPU_FP32.items():
        assert chips[name].gpu_fp32_tflops.value == pytest.approx(tflops)
    assert chips["m3"].gpu_fp32_tflops.source.startswith("estimate")
    assert chips["m4"].gpu_fp32_tflops.source.startswith("estimate")
    assert chips["m1"].gpu_fp32_tflops.source.startswith("Apple Newsroom")


def test_int8_compute_only_from_a17_pro_and_m4():
    chips = load_chips()
    assert {n for n, c in chips.items() if c.ane_int8_compute} == {"a17_pro", "a18_pro", "m4"}
    # Headline int8 TOPS -> half of it for fp16 work.
    assert chips["m4"].ane_fp16_tflops == pytest.approx(19)
    assert chips["m3"].ane_fp16_tflops == pytest.approx(18)


def test_chip_names_are_forgiving_and_unknown_is_usage_error():
    assert get_chip("M3 Max").name == "m3_max"
    assert get_chip("a17pro").name == "a17_pro"
    with pytest.raises(UsageError, match="unknown chip"):
        get_chip("m9")


# --- eligibility rules ------------------------------------------------------------------------


def test_cnn_ops_are_all_ane_eligible():
    ops = _ops(_cnn_program())
    for name in ("conv1", "bn1", "relu1", "pool1", "conv2", "act2", "pool2"):
        assert eligibility(ops[name], "m3") == [], name


def test_fp32_ops_fall_back_from_the_ane_but_not_the_gpu():
    conv = _ops(_cnn_program(types.fp32))["conv1"]
    reasons = eligibility(conv, "m3")
    assert [r.rule for r in reasons] == ["dtype"]
    assert "fp16 only" in reasons[0].message and reasons[0].blocking
    assert gpu_eligibility(conv, "m3") == []


def _lstm_program():
    hidden, features = 8, 4

    @mb.program(input_specs=[mb.TensorSpec(shape=(5, 1, features), dtype=types.fp16)], opset_version=IOS17)
    def prog(x):
        h0 = np.zeros((1, hidden), np.float16)
        outputs = mb.lstm(
            x=x, initial_h=h0, initial_c=h0,
            weight_ih=RNG.random((4 * hidden, features)).astype(np.float16),
            weight_hh=RNG.random((4 * hidden, hidden)).astype(np.float16),
            output_sequence=True, name="encoder_lstm",
        )
        return mb.relu(x=outputs[0], name="after")

    return prog


def test_lstm_is_not_ane_eligible_and_ane_only_names_it():
    prog = _lstm_program()
    reasons = eligibility(_ops(prog)["encoder_lstm"], "m3")
    assert [r.rule for r in reasons] == ["unsupported_op"]
    assert "hollance/neural-engine" in reasons[0].source
    plan = plan_program(prog, policy="ane_only")
    violations = {v["name"]: v for v in plan.violations("ane_only")}
    assert [r["rule"] for r in violations["encoder_lstm"]["reasons"]] == ["unsupported_op"]
    assert violations["encoder_lstm"]["reasons"][0]["fix"]
    assert plan.unit_of("encoder_lstm") == "cpu"
    # the relu could run on the ANE, but the plan keeps it on the CPU beside the LSTM: also a violation
    assert set(violations) == {op.name for op in plan.ops if op.unit != "ane"}
    assert plan.violations("auto") == []


def test_gather_is_not_ane_eligible():
    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 16), dtype=types.int32)], opset_version=IOS17)
    def prog(ids):
        table = RNG.random((100, 32)).astype(np.float16)
        return mb.gather(x=table, indices=ids, axis=0, name="embed")

    reasons = eligibility(_ops(prog)["embed"], "m3")
    assert "unsupported_op" in [r.rule for r in reasons]
    assert gpu_eligibility(_ops(prog)["embed"], "m3") == []


def test_dilated_conv_is_flagged():
    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 8, 32, 32), dtype=types.fp16)], opset_version=IOS17)
    def prog(x):
        return mb.conv(x=x, weight=RNG.random((8, 8, 3, 3)).astype(np.float16), dilations=[2, 2],
                       pad_type="same", name="atrous")

    reasons = eligibility(_ops(prog)["atrous"], "m3")
    assert [r.rule for r in reasons] == ["dilated_conv"]
    assert "[2, 2]" in reasons[0].message


def test_layer_norm_tiny_epsilon_gives_fix_text():
    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 8, 64), dtype=types.fp32)], opset_version=IOS17)
    def prog(x):
        return mb.layer_norm(x=x, axes=[-1], epsilon=np.float32(1e-12), name="ln")

    reasons = {r.rule: r for r in eligibility(_ops(prog)["ln"], "m3")}
    assert "layer_norm eps 1e-12 underflows in fp16: raise it to 1e-5" in reasons["norm_epsilon"].message
    assert "1e-5" in reasons["norm_epsilon"].fix


def test_pooling_and_upsampling_limits():
    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 8, 64, 64), dtype=types.fp16)], opset_version=IOS17)
    def prog(x):
        big = mb.max_pool(x=x, kernel_sizes=[15, 15], strides=[1, 1], pad_type="same", name="big_pool")
        small = mb.max_pool(x=x, kernel_sizes=[3, 3], strides=[2, 2], pad_type="same", name="small_pool")
        up4 = mb.upsample_nearest_neighbor(x=small, scale_factor_height=4, scale_factor_width=4, name="up4")
        up2 = mb.upsample_nearest_neighbor(x=small, scale_factor_height=2, scale_factor_width=2, name="up2")
        return big, up4, up2

    ops = _ops(prog)
    assert [r.rule for r in eligibility(ops["big_pool"], "m3")] == ["pooling"]
    assert eligibility(ops["small_pool"], "m3") == []
    assert [r.rule for r in eligibility(ops["up4"], "m3")] == ["upsampling"]
    assert eligibility(ops["up2"], "m3") == []


def test_rank_and_dimension_limits():
    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 2, 2, 2, 2, 2), dtype=types.fp16),
                             mb.TensorSpec(shape=(1, 20000), dtype=types.fp16)], opset_version=IOS17)
    def prog(a, b):
        return mb.relu(x=a, name="rank6"), mb.relu(x=b, name="wide")

    ops = _ops(prog)
    assert [r.rule for r in eligibility(ops["rank6"], "m3")] == ["rank"]
    assert [r.rule for r in eligibility(ops["wide"], "m3")] == ["dimension"]


def test_range_shapes_fall_back_but_enumerated_do_not():
    seq = ct.RangeDim(lower_bound=1, upper_bound=128)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 16, seq.symbol), dtype=types.fp16)], opset_version=IOS17)
    def prog(x):
        return mb.relu(x=x, name="act")

    cautious = plan_program(prog, policy="cpu_and_ne")
    assert cautious.unit_of("act") == "cpu"
    assert any(r["rule"] == "dynamic_shape" for r in cautious.to_json()["ops"][0]["reasons"])
    enumerated = plan_program(prog, policy="cpu_and_ne", shapes_dynamic=set())
    assert enumerated.to_json()["ops"][0]["reasons"] == []


def test_range_shapes_reach_every_op_downstream_of_the_input(tmp_path):
    """A program read back from its package gives each op's output a fresh symbol; the range
    still reaches every op whose shapes follow the input's, and the plan lists them."""
    from edgebuild_coreml.interpreter import load_mlpackage

    seq = ct.RangeDim(lower_bound=1, upper_bound=128)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 16, seq.symbol), dtype=types.fp32)], opset_version=IOS17)
    def prog(x):
        pooled = mb.max_pool(x=x, kernel_sizes=[2], strides=[2], pad_type="valid", name="pooled")
        return mb.relu(x=pooled, name="act")

    model = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS17, skip_model_load=True,
                       inputs=[ct.TensorType(name="x", shape=ct.Shape((1, 16, seq)))])
    model.save(str(tmp_path / "m.mlpackage"))
    plan = plan_program(load_mlpackage(tmp_path / "m.mlpackage"), policy="cpu_and_ne", shapes_dynamic={"x"})
    flagged = plan.to_json()["range_fallback"]
    assert any("act" in name for name in flagged) and any("pooled" in name for name in flagged)


def test_int8_activations_depend_on_the_chip():
    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 64), dtype=types.fp16)], opset_version=IOS17)
    def prog(x):
        q = mb.quantize(input=x, scale=np.float16(0.1), output_dtype="int8", name="q")
        return mb.dequantize(input=q, scale=np.float16(0.1), name="dq")

    dq = _ops(prog)["dq"]
    assert "int8_compute" in [r.rule for r in eligibility(dq, "m3")]
    assert "int8_compute" not in [r.rule for r in eligibility(dq, "a17_pro")]


def test_linear_on_rank3_input_gets_conv_hint():
    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 64, 32), dtype=types.fp16)], opset_version=IOS17)
    def prog(x):
        return mb.linear(x=x, weight=RNG.random((16, 32)).astype(np.float16), name="proj")

    reasons = eligibility(_ops(prog)["proj"], "m3")
    assert [(r.rule, r.severity) for r in reasons] == [("linear_rank3", "hint")]
    assert "conv 1x1 rewrite" in reasons[0].fix


# --- cost model -------------------------------------------------------------------------------


def test_conv_and_linear_flops_match_hand_count():
    ops = _ops(_cnn_program())
    # conv1: stride 2 -> 112x112 output, 32 filters of 3x3x3.
    assert cost_model.op_cost(ops["conv1"]).flops == 2 * 32 * 112 * 112 * 3 * 3 * 3
    # conv2 on 56x56: 64 filters of 32x3x3.
    assert cost_model.op_cost(ops["conv2"]).flops == 2 * 64 * 56 * 56 * 32 * 3 * 3
    # bytes: fp16 input, weights and output.
    expected = 2 * (3 * 224 * 224 + 32 * 3 * 3 * 3 + 32 * 112 * 112)
    assert cost_model.op_cost(ops["conv1"]).bytes >= expected


def test_roofline_time_is_max_of_compute_and_memory():
    chip = get_chip("m1")
    compute_bound = cost_model.OpCost(flops=1e12, bytes=1.0)
    seconds = 1e12 / (chip.cpu_gflops.value * 1e9 * cost_model.SUSTAINED_COMPUTE["cpu"])
    assert cost_model.unit_time_ms(compute_bound, "cpu", chip) == pytest.approx(
        seconds * 1e3 + cost_model.DISPATCH_MS["cpu"]
    )
    memory_bound = cost_model.OpCost(flops=1.0, bytes=68.25e9)
    expected = 1.0 / cost_model.SUSTAINED_BANDWIDTH["gpu"] * 1e3 + cost_model.DISPATCH_MS["gpu"]
    assert cost_model.unit_time_ms(memory_bound, "gpu", chip) == pytest.approx(expected)
    assert cost_model.switch_cost_ms(1e6, "ane", "ane", chip) == 0
    assert cost_model.switch_cost_ms(1e6, "ane", "gpu", chip) > cost_model.switch_cost_ms(1e6, "ane", "cpu", chip)


# --- plan -------------------------------------------------------------------------------------


def test_cnn_plan_under_cpu_and_ne_puts_conv_bn_activation_on_ane():
    plan = plan_program(_cnn_program(), chip="m3", policy="cpu_and_ne")
    units = {op.name: op.unit for op in plan.ops}
    for name in ("conv1", "bn1", "relu1", "pool1", "conv2", "act2"):
        assert units[name] == "ane", name
    fused = {op.name: op.fused_into for op in plan.ops}
    assert fused["bn1"] == "conv1" and fused["relu1"] == "conv1" and fused["act2"] == "conv2"
    assert all(op.est_ms == 0 for op in plan.ops if op.fused_into)


def test_converted_fp16_program_runs_on_ane():
    mlmodel = ct.convert(_cnn_program(types.fp32), convert_to="mlprogram",
                         compute_precision=ct.precision.FLOAT16, minimum_deployment_target=IOS17,
                         skip_model_load=True)
    plan = plan_program(mlmodel._mil_program, chip="m2", policy="cpu_and_ne")
    assert plan.breakdown()["ane"] == 100.0
    assert all(op.reasons == [] for op in plan.ops)


def test_plan_json_shape():
    data = plan_program(_cnn_program(), chip="m4", policy="auto").to_json()
    assert set(data) == {"ops", "breakdown", "total_ms", "chip", "note"}
    assert data["note"] == NOTE == "Core ML decides placement when the model loads; this is a prediction."
    assert data["chip"] == "m4"
    assert set(data["breakdown"]) == {"ane", "gpu", "cpu"}
    assert sum(data["breakdown"].values()) == pytest.approx(100, abs=0.2)
    assert data["total_ms"] == pytest.approx(sum(op["est_ms"] for op in data["ops"]), rel=1e-4)
    for op in data["ops"]:
        assert set(op) == {"name", "op", "unit", "est_ms", "fused_into", "reasons"}
        assert op["unit"] in ("ane", "gpu", "cpu")


def test_cpu_only_puts_everything_on_cpu():
    plan = plan_program(_cnn_program(), policy="cpu_only")
    assert {op.unit for op in plan.ops} == {"cpu"}
    assert plan.breakdown() == {"ane": 0.0, "gpu": 0.0, "cpu": 100.0}


def test_fp32_program_under_cpu_and_gpu_avoids_ane_and_gpu_only_has_no_violations():
    plan = plan_program(_cnn_program(types.fp32), policy="cpu_and_gpu")
    assert "ane" not in {op.unit for op in plan.ops}
    assert plan.violations("gpu_only") == []
    assert [v["name"] for v in plan.violations("ane_only")][:1] == ["conv1"]


def test_overrides_by_op_type_and_name_regex():
    by_type = plan_program(_cnn_program(), policy="auto",
                           overrides=[{"match": {"op_type": "max_pool"}, "unit": "gpu"}])
    assert by_type.unit_of("pool1") == "gpu"
    by_name = plan_program(_cnn_program(), policy="auto",
                           overrides=[{"match": {"name": "conv[12]"}, "unit": "cpu"}])
    assert by_name.unit_of("conv1") == "cpu" and by_name.unit_of("conv2") == "cpu"
    assert by_name.unit_of("bn1") == "cpu"  # fused ops follow their host
    excluded = plan_program(_cnn_program(), policy="cpu_and_ne",
                            overrides=[{"match": {"op_type": "conv"}, "unit": "gpu"}])
    assert excluded.unit_of("conv1") != "gpu"
    assert any(r["rule"] == "override" for r in excluded.to_json()["ops"][0]["reasons"])
    # an unknown unit or policy is the recipe's to refuse, at load (tests/test_recipe_field_owners.py)


def test_the_plan_reads_the_recipe_models_compute_section():
    from edgebuild.plugin.recipe import Compute

    compute = Compute.model_validate({"policy": "cpu_and_ne", "overrides": [{"match": {"op_type": "conv"},
                                                                            "unit": "cpu"}]})
    plan = plan_program(_cnn_program(), chip=compute.chip, policy=compute.policy, overrides=compute.overrides)
    assert plan.policy == "cpu_and_ne" and plan.unit_of("conv1") == "cpu"
    assert plan_program(_cnn_program()).policy == Compute().policy  # the defaults are the recipe's


def test_the_cli_renders_a_plan_from_its_data():
    from edgebuild.report.compute_plan import render

    plan = plan_program(_cnn_program(), policy="cpu_and_ne")
    data = {**plan.to_json(), "policy": plan.policy}
    console = Console(file=io.StringIO(), width=200, record=True)
    render(data, console)
    summary = console.export_text()
    assert "breakdown by unit" in summary and "by reason and op type" in summary and NOTE in summary
    assert "conv1" not in summary  # one row per op only when asked for
    render(data, console, ops=True)
    text = console.export_text()
    assert "conv1" in text and "pool2" in text


# --- rewrites ---------------------------------------------------------------------------------


def _run(prog, inputs):
    interpreter = pytest.importorskip("edgebuild_coreml.interpreter")
    return next(iter(interpreter.run_program(prog, inputs).values()))


def _transformer_block(epsilon=1e-5):
    weight = RNG.standard_normal((64, 64)).astype(np.float32) * 0.1
    bias = RNG.standard_normal(64).astype(np.float32)

    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 16, 64), dtype=types.fp32)], opset_version=IOS17)
    def prog(x):
        q = mb.linear(x=x, weight=weight, bias=bias, name="q_proj")
        heads = mb.transpose(x=mb.reshape(x=q, shape=[2, 16, 4, 16]), perm=[0, 2, 1, 3], name="heads")
        scores = mb.matmul(x=heads, y=heads, transpose_y=True, name="scores")
        scores = mb.mul(x=scores, y=np.float32(0.25), name="scale")
        attn = mb.softmax(x=scores, axis=-1, name="attn")
        ctx = mb.matmul(x=attn, y=heads, name="ctx")
        merged = mb.reshape(x=mb.transpose(x=ctx, perm=[0, 2, 1, 3]), shape=[2, 16, 64], name="merged")
        return mb.layer_norm(x=merged, axes=[-1], epsilon=np.float32(epsilon), name="ln")

    return prog, weight, bias


def test_linear_to_conv_preserves_semantics_and_clears_the_hint():
    prog, weight, bias = _transformer_block()
    x = RNG.standard_normal((2, 16, 64)).astype(np.float32)
    before_out = _run(prog, {"x": x})
    before = plan_program(prog, policy="cpu_and_ne")
    assert any(r["rule"] == "linear_rank3" for op in before.to_json()["ops"] for r in op["reasons"])

    assert linear_to_conv(prog) == 1
    op_types = [op.op_type for op in prog.functions["main"].operations]
    assert "linear" not in op_types and "conv" in op_types
    conv = next(op for op in prog.functions["main"].operations if op.op_type == "conv")
    assert tuple(conv.inputs["x"].shape) == (2, 64, 1, 16)  # (B, C, 1, S)
    np.testing.assert_allclose(_run(prog, {"x": x}), before_out, rtol=1e-4, atol=1e-4)
    after = plan_program(prog, policy="cpu_and_ne")
    assert not any(r["rule"] == "linear_rank3" for op in after.to_json()["ops"] for r in op["reasons"])


def test_linear_to_conv_matches_numpy_projection():
    weight = RNG.standard_normal((24, 32)).astype(np.float32)
    bias = RNG.standard_normal(24).astype(np.float32)

    @mb.program(input_specs=[mb.TensorSpec(shape=(3, 10, 32), dtype=types.fp32)], opset_version=IOS17)
    def prog(x):
        return mb.linear(x=x, weight=weight, bias=bias, name="proj")

    assert linear_to_conv(prog) == 1
    x = RNG.standard_normal((3, 10, 32)).astype(np.float32)
    np.testing.assert_allclose(_run(prog, {"x": x}), x @ weight.T + bias, rtol=1e-4, atol=1e-4)


def test_split_attention_heads_preserves_semantics():
    prog, _, _ = _transformer_block()
    x = RNG.standard_normal((2, 16, 64)).astype(np.float32)
    reference = _run(prog, {"x": x})
    assert split_attention_heads(prog) == 1
    matmuls = [op for op in prog.functions["main"].operations if op.op_type == "matmul"]
    assert len(matmuls) == 8 and all(op.outputs[0].shape[1] == 1 for op in matmuls)
    np.testing.assert_allclose(_run(prog, {"x": x}), reference, rtol=1e-4, atol=1e-5)


def test_split_attention_heads_on_sdpa_matches_numpy():
    q = RNG.standard_normal((1, 3, 8, 4)).astype(np.float32)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 3, 8, 4), dtype=types.fp32)], opset_version=ct.target.iOS18)
    def prog(x):
        return mb.scaled_dot_product_attention(query=x, key=x, value=x, name="sdpa")

    assert split_attention_heads(prog) == 1
    scores = q @ q.transpose(0, 1, 3, 2) / np.sqrt(4)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    np.testing.assert_allclose(_run(prog, {"x": q}), weights @ q, rtol=1e-4, atol=1e-5)


def test_clamp_norm_epsilon_moves_layer_norm_back_to_ane():
    prog, _, _ = _transformer_block(epsilon=1e-12)
    before = plan_program(prog, policy="cpu_and_ne")
    assert any(r["rule"] == "norm_epsilon" for r in before.to_json()["ops"][-1]["reasons"])
    assert clamp_norm_epsilon(prog) == 1
    ln = _ops(prog)["ln"]
    assert float(ln.inputs["epsilon"].val) == pytest.approx(1e-5)
    assert clamp_norm_epsilon(prog) == 0  # idempotent
    after_rules = [r.rule for r in eligibility(ln, "m3")]
    assert "norm_epsilon" not in after_rules
