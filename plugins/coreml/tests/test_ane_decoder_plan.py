"""The compute plan of stateful decoders: state, cache-write, attention, int4-weight and int32
rules; the plan per query length; the ANE layout rewrite (outputs equal, plan before/after)."""

from __future__ import annotations

import io

import coremltools as ct
import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types
from decoder_programs import (
    SMOLLM2_135M,
    DecoderConfig,
    decoder_inputs,
    decoder_layer_program,
)
from edgebuild.plugin.recipe import Compute
from edgebuild_coreml.ane import cost as cost_model
from edgebuild_coreml.ane.chips import get_chip
from edgebuild_coreml.ane.per_shape import plan_per_shape, retyped, specialise, summary
from edgebuild_coreml.ane.plan import plan_program
from edgebuild_coreml.ane.rewrites import REWRITES, ane_layout
from edgebuild_coreml.ane.rules import eligibility, gpu_eligibility
from rich.console import Console

QUERY_LENGTHS = (1, 64)
CHOICES = [{"hidden_states": (1, q, SMOLLM2_135M.hidden)} for q in QUERY_LENGTHS]


def _ops(prog):
    return {op.name: op for op in prog.functions["main"].operations}


def _rules(op, chip="m3"):
    return [r.rule for r in eligibility(op, chip)]


def _cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# --- rules --------------------------------------------------------------------------------------


def test_fp16_kv_cache_state_ops_are_ane_eligible():
    ops = _ops(decoder_layer_program(query_length=1))
    for name in ("key_cache_read", "key_cache_update", "value_cache_read", "value_cache_update"):
        assert _rules(ops[name]) == [], name
        assert gpu_eligibility(ops[name]) == []


def test_fp32_state_and_unaligned_head_dim_keep_the_cache_off_the_ane():
    fp32 = _ops(decoder_layer_program(query_length=1, dtype=types.fp32))
    reasons = eligibility(fp32["key_cache_read"], "m3")
    assert "state" in [r.rule for r in reasons]
    state = next(r for r in reasons if r.rule == "state")
    assert "key_cache" in state.message and "fp32" in state.message and "coremltools/issues/2631" in state.source
    # head_dim 48 (hidden 432 / 9 heads): the state's last dimension is not a multiple of 32
    unaligned = _ops(decoder_layer_program(DecoderConfig(hidden=432), query_length=1))
    assert "state" in _rules(unaligned["value_cache_update"])


def test_cache_write_is_ane_eligible_for_one_token_not_for_64():
    one = _ops(decoder_layer_program(query_length=1))
    assert _rules(one["key_cache_write"]) == []
    many = _ops(decoder_layer_program(query_length=64))
    reasons = [r for r in eligibility(many["key_cache_write"], "m3") if r.rule == "slice_update"]
    assert len(reasons) == 1 and reasons[0].blocking
    assert "writes 64 positions along axis 2" in reasons[0].message and "at most 32" in reasons[0].message
    assert "Anemll" in reasons[0].source
    assert gpu_eligibility(many["key_cache_write"]) == []


def test_int32_position_arithmetic_runs_on_the_cpu():
    prog = decoder_layer_program(query_length=64)
    ops = _ops(prog)
    for name in ("positions", "cache_end", "cache_begin", "visible"):
        assert "int_arithmetic" in _rules(ops[name]), name
        assert "dtype" not in _rules(ops[name])  # one reason, the one that says why
    plan = plan_program(prog)
    assert all(plan.unit_of(name) == "cpu" for name in ("positions", "cache_end", "cache_begin", "visible"))


def test_multi_head_sdpa_is_a_hint_that_the_layout_rewrite_clears():
    prog = decoder_layer_program(query_length=64)
    reasons = eligibility(_ops(prog)["sdpa"], "m3")
    assert [r.rule for r in reasons] == ["attention_heads"] and not reasons[0].blocking
    assert "9 heads" in reasons[0].message and "ane_layout" in reasons[0].fix
    ane_layout(prog)
    heads = [op for op in prog.functions["main"].operations if op.op_type == "scaled_dot_product_attention"]
    assert len(heads) == 9 and all(_rules(op) == [] for op in heads)


def test_a_range_query_length_keeps_the_layer_off_the_ane(flexible_decoder):
    """Query lengths as a range (not enumerated): every op its shape reaches falls back."""
    plan = plan_program(flexible_decoder, shapes_dynamic={"hidden_states"})
    fallback = set(plan.range_fallback())
    assert {"q_proj", "sdpa", "key_cache_write", "down_proj"} <= fallback
    assert not any(op.unit == "ane" for op in plan.ops if op.name in fallback)
    assert "key_cache_read" not in fallback  # the state's own shape is fixed


def _blockwise_linear_program(dtype=types.fp16, tokens=1, offset=False):
    """A 4-bit per-block linear, as coremltools' per_block int4 quantization writes it (block 32);
    at one token it is memory bound, where reading fewer weight bytes shows."""
    np_dtype = np.float16 if dtype == types.fp16 else np.float32
    rng = np.random.default_rng(0)
    out_features, in_features, block = 256, 512, 32
    scale = (rng.random((out_features, in_features // block)) * 0.01).astype(np_dtype)
    if offset:  # unsigned codes with a zero point, as MatMulNBits with zero_points lowers
        data = rng.integers(0, 16, (out_features, in_features)).astype(types.np_uint4_dtype)
        zero = rng.integers(0, 16, scale.shape).astype(types.np_uint4_dtype)
        extra = {"offset": zero}
    else:
        data = rng.integers(-8, 8, (out_features, in_features)).astype(np.int8).astype(types.np_int4_dtype)
        extra = {}

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, tokens, in_features), dtype=dtype)],
                opset_version=ct.target.iOS18)
    def prog(x):
        weight = mb.constexpr_blockwise_shift_scale(data=data, scale=scale, name="weight_int4", **extra)
        return mb.linear(x=x, weight=weight, name="proj")

    return prog


def _palettized_linear_program():
    """A 4-bit palettized linear (one 16-entry table per group of 32 output channels), iOS18 form."""
    rng = np.random.default_rng(1)
    out_features, in_features, group = 64, 96, 32
    indices = rng.integers(0, 16, (out_features, in_features)).astype(types.np_uint4_dtype)
    lut = rng.standard_normal((out_features // group, 1, 16, 1)).astype(np.float32) * 0.1

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 5, in_features), dtype=types.fp32)],
                opset_version=ct.target.iOS18)
    def prog(x):
        weight = mb.constexpr_lut_to_dense(indices=indices, lut=lut, name="weight_lut")
        return mb.linear(x=x, weight=weight, name="proj")

    return prog


def test_int4_blockwise_weights_are_read_compressed_on_the_gpu_only():
    prog = _blockwise_linear_program()
    proj = _ops(prog)["proj"]
    reasons = eligibility(proj, "m3")
    hint = next(r for r in reasons if r.rule == "blockwise_weights")
    assert not hint.blocking and "weight_int4" in hint.message and "GPU" in hint.message
    cost = cost_model.op_cost(proj)
    dense = 256 * 512 * 2
    stored = 256 * 512 / 2 + 256 * 16 * 2  # int4 data + fp16 scales
    assert cost.bytes_on("ane") == pytest.approx(cost.bytes)
    assert cost.bytes - cost.bytes_on("gpu") == pytest.approx(dense - stored)
    chip = get_chip("m3")
    assert cost_model.unit_time_ms(cost, "gpu", chip) < cost_model.unit_time_ms(
        cost_model.OpCost(cost.flops, cost.bytes), "gpu", chip)


def test_int4_decoder_layer_decode_step_is_cheaper_on_the_gpu():
    """At one token the layer is weight-bandwidth bound: 4-bit weights cut the GPU's estimate,
    not the ANE's (which reads them as fp16), and each projection carries the hint."""
    dense = plan_program(decoder_layer_program(query_length=1), policy="cpu_and_gpu", chip="m3")
    int4_prog = decoder_layer_program(query_length=1, int4_weights=True)
    int4 = plan_program(int4_prog, policy="cpu_and_gpu", chip="m3")
    projections = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    for name in projections:
        assert "blockwise_weights" in _rules(_ops(int4_prog)[name])
    ms = {op.name: op.unit_ms for op in int4.ops}
    dense_ms = {op.name: op.unit_ms for op in dense.ops}
    assert all(ms[name]["gpu"] < dense_ms[name]["gpu"] for name in ("gate_proj", "up_proj", "down_proj"))
    ane_int4 = plan_program(int4_prog, policy="cpu_and_ne", chip="m3")
    ane_dense = plan_program(decoder_layer_program(query_length=1), policy="cpu_and_ne", chip="m3")
    assert {op.name: op.unit_ms.get("ane") for op in ane_int4.ops}["gate_proj"] == pytest.approx(
        {op.name: op.unit_ms.get("ane") for op in ane_dense.ops}["gate_proj"])


# --- per query length ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def flexible_decoder():
    return decoder_layer_program()  # query length Q symbolic, as the artifact enumerates it


def test_plan_per_query_length_has_one_row_each(flexible_decoder):
    before = [op.name for op in flexible_decoder.functions["main"].operations]
    rows = plan_per_shape(flexible_decoder, CHOICES, chip="m3", query_input="hidden_states")
    assert [r["query_length"] for r in rows] == list(QUERY_LENGTHS)
    for row in rows:
        assert row["ops"] > 60 and 0 <= row["ane_ops"] <= row["ops"]
        assert row["ane_op_share"] == pytest.approx(100.0 * row["ane_ops"] / row["ops"], abs=0.1)
        assert row["ane_time_share"] == pytest.approx(row["breakdown"]["ane"], abs=0.2)
    one, many = rows
    # Prefill (64 tokens) is compute enough to pay for the ANE; a single-token step, with its
    # switches around the CPU-only ops, is not in this estimate.
    assert many["ane_time_share"] > 50.0 > one["ane_time_share"]
    # the source program is left as it was: same ops, symbolic query length, no weight ids
    main = flexible_decoder.functions["main"]
    assert [op.name for op in main.operations] == before
    assert all(op.weight_id is None for op in main.operations if op.op_type == "const")


@pytest.mark.parametrize("choice", CHOICES, ids=lambda c: f"Q={c['hidden_states'][1]}")
def test_retyping_in_place_plans_as_a_materialised_copy_and_restores_every_type(flexible_decoder, choice):
    main = flexible_decoder.functions["main"]
    variables = list(main.inputs.values()) + [var for op in main.operations for var in op.outputs]
    before = [(var._sym_type, var._sym_val) for var in variables]
    copied = summary(plan_program(specialise(flexible_decoder, choice), shapes_dynamic=set()))
    with retyped(flexible_decoder, choice) as fixed:
        assert fixed is flexible_decoder
        assert tuple(main.outputs[0].shape) == (1, choice["hidden_states"][1], SMOLLM2_135M.hidden)
        in_place = summary(plan_program(fixed, shapes_dynamic=set()))
    assert in_place == copied
    after = [(var._sym_type, var._sym_val) for var in variables]
    assert all(a[0] is b[0] and a[1] is b[1] for a, b in zip(after, before))


def test_a_program_with_control_flow_is_not_retyped_in_place():
    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 4), dtype=types.fp32)])
    def looped(x):
        def cond(i, y):
            return mb.less(x=i, y=np.int32(3))

        def body(i, y):
            return mb.add(x=i, y=np.int32(1)), mb.mul(x=y, y=2.0)

        return mb.while_loop(_cond=cond, _body=body, loop_vars=(np.int32(0), mb.relu(x=x)))[1]

    with pytest.raises(NotImplementedError):  # (plan_per_shape then plans a materialised copy)
        with retyped(looped, {"x": (1, 4)}):
            pass


def test_specialised_program_fixes_every_shape_and_keeps_the_states(flexible_decoder):
    fixed = specialise(flexible_decoder, CHOICES[1])
    main = fixed.functions["main"]
    assert types.is_state(main.inputs["key_cache"].sym_type)
    write = _ops(fixed)["key_cache_write"]
    assert tuple(write.inputs["update"].shape) == (1, 3, 64, 64)
    assert tuple(main.outputs[0].shape) == (1, 64, SMOLLM2_135M.hidden)
    plan = plan_program(fixed)
    assert plan.unit_of("key_cache_write") != "ane"


def test_report_and_cli_show_one_row_per_query_length(flexible_decoder):
    from edgebuild.report.compute_plan import render

    plan = plan_program(flexible_decoder)
    rows = plan_per_shape(flexible_decoder, CHOICES, query_input="hidden_states")
    data = {**plan.to_json(), "policy": plan.policy, "per_shape": rows}
    console = Console(file=io.StringIO(), width=220, record=True)
    render(data, console)
    text = console.export_text()
    assert "per enumerated shape" in text and "Q=1" in text and "Q=64" in text


def test_recipe_enumerated_shapes_give_the_plan_rows(flexible_decoder):
    from edgebuild_coreml.compute import enumerated_choices, per_shape_plans

    recipe_inputs = {
        "hidden_states": {"shape": [1, {"enumerated": list(QUERY_LENGTHS)}, SMOLLM2_135M.hidden],
                          "dtype": "float16", "value": None},
        "position": {"shape": [1], "dtype": "int32", "value": None},
    }
    choices = enumerated_choices(recipe_inputs, {})
    assert choices == CHOICES
    rows = per_shape_plans(flexible_decoder, Compute(policy="cpu_and_ne", chip="m4"), choices)["per_shape"]
    assert [r["varying"] for r in rows] == [{"input": "hidden_states", "axis": 1, "size": q} for q in QUERY_LENGTHS]
    assert "query_length" not in rows[0]  # only the contract's input_ids is a query length by name
    assert per_shape_plans(flexible_decoder, {}, []) == {}
    assert "per_shape_error" in per_shape_plans(flexible_decoder, {}, [{"hidden_states": (1, 1, 7)}])


# --- the ANE layout rewrite ------------------------------------------------------------------


def test_ane_layout_is_a_named_rewrite():
    from edgebuild_coreml.compute import REWRITE_NAMES

    assert "ane_layout" in REWRITES and "ane_layout" in REWRITE_NAMES


@pytest.mark.parametrize("query_length, position, int4", [(1, 17, False), (64, 5, False), (64, 5, True)],
                         ids=["decode", "prefill", "prefill_int4"])
def test_ane_layout_keeps_the_decoder_layer_outputs(query_length, position, int4):
    interpreter = pytest.importorskip("edgebuild_coreml.interpreter")
    prog = decoder_layer_program(dtype=types.fp32, int4_weights=int4)
    feeds = decoder_inputs(SMOLLM2_135M, query_length, position)
    written = {}

    def record(op, outputs):
        if op.op_type == "coreml_update_state":
            written[op.name] = outputs[0]

    reference = interpreter.run_program(prog, feeds, observer=record)["output"]
    cache_reference = dict(written)
    assert ane_layout(prog) == 8  # 7 linears, 1 attention
    op_types = {op.op_type for op in prog.functions["main"].operations}
    assert "linear" not in op_types and "conv" in op_types
    conv = _ops(prog)["q_proj_conv1x1"]
    assert tuple(conv.inputs["x"].shape)[:3] == (1, SMOLLM2_135M.hidden, 1)  # (B, C, 1, S)
    assert (conv.inputs["weight"].op.op_type == "constexpr_blockwise_shift_scale") == int4
    # q, k and v read one channels-first copy of the normalised input
    assert conv.inputs["x"] is _ops(prog)["k_proj_conv1x1"].inputs["x"]
    # the SwiGLU MLP stays channels-first: silu(gate) * up feeds the down projection's conv directly
    swiglu = _ops(prog)["down_proj_conv1x1"].inputs["x"].op
    assert swiglu.op_type == "mul" and {v.op.op_type for v in (swiglu.inputs["x"], swiglu.inputs["y"])} == {"silu", "conv"}
    written.clear()
    result = interpreter.run_program(prog, feeds, observer=record)["output"]
    assert _cosine(result, reference) >= 0.9999
    np.testing.assert_allclose(result, reference, rtol=1e-4, atol=1e-4)
    for name, cache in cache_reference.items():
        np.testing.assert_allclose(written[name], cache, rtol=1e-5, atol=1e-5)


def test_plan_previews_the_ane_layout_when_it_is_off(flexible_decoder):
    from edgebuild_coreml.compute import ane_layout_preview

    from edgebuild.report.compute_plan import ane_layout_line

    before = [op.name for op in flexible_decoder.functions["main"].operations]
    preview = ane_layout_preview(flexible_decoder, Compute(), CHOICES)["ane_layout_preview"]
    assert preview["sites"] == 8 and preview["after"]["ops"] > preview["before"]["ops"]
    assert [row["after"]["varying"]["size"] for row in preview["per_shape"]] == list(QUERY_LENGTHS)
    assert [op.name for op in flexible_decoder.functions["main"].operations] == before  # untouched
    line = ane_layout_line(preview)
    assert line.startswith("compute.rewrites.ane_layout would rewrite 8 site(s): ANE share of time")
    assert "hidden_states[1]=64:" in line
    assert ane_layout_preview(flexible_decoder, Compute(rewrites={"ane_layout": True}), []) == {}
    assert ane_layout_preview(flexible_decoder, Compute(policy="cpu_and_gpu"), []) == {}

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 3, 32, 32), dtype=types.fp16)], opset_version=ct.target.iOS18)
    def cnn(x):
        return mb.relu(x=mb.conv(x=x, weight=np.ones((8, 3, 3, 3), np.float16), name="conv"), name="act")

    assert ane_layout_preview(cnn, Compute(), []) == {}  # nothing to rewrite, nothing copied


@pytest.mark.parametrize("build", [
    lambda: _blockwise_linear_program(types.fp32, tokens=7),
    lambda: _blockwise_linear_program(types.fp32, tokens=7, offset=True),
    _palettized_linear_program,
], ids=["int4_blockwise", "uint4_blockwise_offset", "palettized"])
def test_compressed_linears_become_compressed_convs(build):
    interpreter = pytest.importorskip("edgebuild_coreml.interpreter")
    prog = build()
    x = np.random.default_rng(2).standard_normal(tuple(prog.functions["main"].inputs["x"].shape)).astype(np.float32)
    reference = interpreter.run_program(prog, {"x": x})["proj"]
    assert ane_layout(prog) == 1
    conv = next(op for op in prog.functions["main"].operations if op.op_type == "conv")
    assert conv.inputs["weight"].op.op_type.startswith("constexpr_")  # still compressed
    assert tuple(conv.inputs["weight"].shape)[2:] == (1, 1)
    result = interpreter.run_program(prog, {"x": x})["proj"]
    assert _cosine(result, reference) >= 0.9999
    np.testing.assert_allclose(result, reference, rtol=1e-4, atol=1e-4)


def test_compressed_conv_survives_coremltools_passes(tmp_path):
    """compose_conv1d folds expand_dims -> conv -> squeeze into a conv1d, squeezing the kernel at
    run time; the rewrite's (B, O, 1, S) -> (B, S, O) exit keeps the kernel a constexpr."""
    from edgebuild_coreml.interpreter import load_mlpackage

    prog = _blockwise_linear_program(types.fp16, tokens=7)
    ane_layout(prog)
    model = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS18,
                       skip_model_load=True)
    model.save(str(tmp_path / "m.mlpackage"))
    saved = load_mlpackage(tmp_path / "m.mlpackage")
    conv = next(op for op in saved.functions["main"].operations if op.op_type == "conv")
    assert conv.inputs["weight"].op.op_type == "constexpr_blockwise_shift_scale"
    assert tuple(conv.outputs[0].shape) == (1, 256, 1, 7)


def test_decoder_layer_matches_a_numpy_reference():
    """The test program is the layer it claims to be (llama attention with a KV cache)."""
    interpreter = pytest.importorskip("edgebuild_coreml.interpreter")
    from decoder_programs import _rope_tables, _weights

    config, q_len, position = SMOLLM2_135M, 3, 6
    feeds = decoder_inputs(config, q_len, position)
    got = interpreter.run_program(decoder_layer_program(dtype=types.fp32), feeds)["output"]
    w = _weights(config, 0)
    cos, sin = _rope_tables(config)
    heads, kv_heads, d = config.heads, config.kv_heads, config.head_dim

    def rms(x, weight):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + config.rms_eps) * weight

    def rope(x, pos):  # x [H, Q, D]
        rotated = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], -1)
        return x * cos[pos] + rotated * sin[pos]

    x = feeds["hidden_states"][0]
    pos = np.arange(position, position + q_len)
    xn = rms(x, w["input_norm"])
    q = rope((xn @ w["q_proj"].T).reshape(q_len, heads, d).transpose(1, 0, 2), pos)
    k = rope((xn @ w["k_proj"].T).reshape(q_len, kv_heads, d).transpose(1, 0, 2), pos)
    v = (xn @ w["v_proj"].T).reshape(q_len, kv_heads, d).transpose(1, 0, 2)
    keys, values = feeds["key_cache"][0].copy(), feeds["value_cache"][0].copy()
    keys[:, position:position + q_len], values[:, position:position + q_len] = k, v
    keys, values = np.repeat(keys, heads // kv_heads, 0), np.repeat(values, heads // kv_heads, 0)
    scores = q @ keys.transpose(0, 2, 1) / np.sqrt(d)
    scores = np.where(np.arange(config.max_context)[None, :] <= pos[:, None], scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    attn = (weights / weights.sum(-1, keepdims=True)) @ values
    h = x + attn.transpose(1, 0, 2).reshape(q_len, -1) @ w["o_proj"].T
    y = rms(h, w["post_norm"])
    gate = y @ w["gate_proj"].T
    expected = h + ((gate / (1 + np.exp(-gate))) * (y @ w["up_proj"].T)) @ w["down_proj"].T
    assert _cosine(got[0], expected) >= 0.9999
    np.testing.assert_allclose(got[0], expected, rtol=1e-3, atol=1e-3)


def test_ane_layout_plan_before_and_after_per_query_length():
    before_prog = decoder_layer_program()
    before = plan_per_shape(before_prog, CHOICES, query_input="hidden_states")
    after_prog = decoder_layer_program()
    ane_layout(after_prog)
    after = plan_per_shape(after_prog, CHOICES, query_input="hidden_states")
    for old, new in zip(before, after):
        assert new["query_length"] == old["query_length"]
        assert new["ops"] > old["ops"]  # per-head attention and the layout transposes
    # at prefill the convs and per-head attention put more of the layer's ops on the ANE
    assert after[1]["ane_ops"] > before[1]["ane_ops"]
    hints = {r["rule"] for op in plan_program(specialise(after_prog, CHOICES[1])).to_json()["ops"]
             for r in op["reasons"]}
    assert not hints & {"linear_rank3", "attention_heads"}


# --- through a build ------------------------------------------------------------------------


def _sequence_linear_onnx(path):
    """y = x @ w + b on a [1, S, 16] sequence with S flexible: a projection at each query length."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"], name="proj"),
         helper.make_node("Add", ["m", "b"], ["y"], name="bias")],
        "sequence_linear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "S", 8])],
        [numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, path)


def _recipe(path, compute: str):
    path.write_text(
        "edgebuild: 1\n"
        f"name: {path.stem}\n"
        "source:\n  model: sequence_linear.onnx\n"
        "  inputs: {x: {shape: [1, {enumerated: [1, 8]}, 16], dtype: float32}}\n"
        "target: {backend: coreml, precision: float16}\n"
        f"compute: {compute}\n"
        "validate: {samples: 1, thresholds: {cosine_min: 0.999}}\n"
        f"outputs: {{dir: out_{path.stem}}}\n")
    return path


def test_build_and_plan_carry_per_shape_rows_and_the_ane_layout(tmp_path, capsys):
    import json

    from rich.console import Console

    from edgebuild.build.run import run_recipes
    from edgebuild.cli.plan import plan_recipe

    cache = tmp_path / "cache"
    _sequence_linear_onnx(tmp_path / "sequence_linear.onnx")
    planned = _recipe(tmp_path / "planned.yaml", "{policy: auto}")
    plan_recipe(str(planned), cache_dir=str(cache), as_json=True)
    data = json.loads(capsys.readouterr().out)
    assert [row["varying"] for row in data["per_shape"]] == [
        {"input": "x", "axis": 1, "size": size} for size in (1, 8)]
    assert data["ane_layout_preview"]["sites"] == 1

    built = _recipe(tmp_path / "built.yaml", "{policy: auto, rewrites: {ane_layout: true}}")
    code = run_recipes([str(built)], cache_dir=str(cache), console=Console(file=io.StringIO(), width=200))
    assert code == 0
    report = json.loads((tmp_path / "out_built" / "default" / "report.json").read_text())
    assert report["lower"]["rewrites"] == {"ane_layout": 1}
    assert [row["varying"]["size"] for row in report["lower"]["plan"]["per_shape"]] == [1, 8]
    html = (tmp_path / "out_built" / "default" / "report.html").read_text()
    assert "per enumerated shape" in html and "x[1]=8" in html
