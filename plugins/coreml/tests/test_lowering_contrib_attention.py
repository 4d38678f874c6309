"""com.microsoft Attention, MultiHeadAttention and GroupQueryAttention (lowering/ops/contrib_attention.py)
against onnxruntime's CPU kernels.

Each case is a one-node model run the way ``edgebuild conformance`` runs ONNX node cases
(conformance_runner.run_onnx_case: iOS18, float32, the MIL interpreter) and compared with
onnxruntime on the same model and inputs: cosine >= 0.9999 and a max-abs bound.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx_cases import rand, run_onnxruntime, single_node_model

from edgebuild_coreml.conformance_runner import run_onnx_case
from edgebuild_coreml.lowering.errors import LoweringError

MS = "com.microsoft"
MAX_ABS = 1e-4


def _compare(model, feeds):
    names = [v.name for v in model.graph.input]
    expected = run_onnxruntime(model, feeds)
    actual = run_onnx_case(model, [feeds[n] for n in names])
    for (name, reference), ours in zip(expected.items(), actual):
        reference, ours = reference.astype(np.float64), ours.astype(np.float64)
        assert ours.shape == reference.shape, f"{name}: {ours.shape} != {reference.shape}"
        cosine = float(np.dot(ours.ravel(), reference.ravel()) / (np.linalg.norm(ours) * np.linalg.norm(reference) + 1e-30))
        assert cosine >= 0.9999, f"{name}: cosine {cosine}"
        assert np.max(np.abs(ours - reference)) <= MAX_ABS, f"{name}: max abs {np.max(np.abs(ours - reference))}"


def _model(op, inputs, outputs, attrs, initializers=()):
    return single_node_model(op, inputs, outputs=outputs, attrs=attrs, domain=MS, initializers=initializers)


def _feeds(inputs, initializers=()):
    return {k: v for k, v in inputs.items() if v is not None and k not in initializers}


B, S, HEADS, SIZE = 2, 5, 2, 4
HIDDEN = HEADS * SIZE


# -- Attention ------------------------------------------------------------------------------
def _attention_mask(form):
    lengths = np.array([5, 3], np.int32)
    if form == "none":
        return None
    if form == "lengths":
        return lengths
    if form == "end_start":
        return np.array([5, 4, 0, 1], np.int32)
    raw = (np.arange(S)[None] < lengths[:, None]).astype(np.int32)
    if form == "raw2d":
        return raw
    if form == "raw3d":
        return np.broadcast_to(raw[:, None, :], (B, S, S)) * np.tril(np.ones((S, S), np.int32))[None]
    raise AssertionError(form)


@pytest.mark.parametrize("mask", ["none", "lengths", "end_start", "raw2d", "raw3d"])
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_attention_masks(mask, unidirectional):
    inputs = {"x": rand(B, S, 6), "w": rand(6, 3 * HIDDEN, seed=1), "b": rand(3 * HIDDEN, seed=2),
              "mask": _attention_mask(mask)}
    model = _model("Attention", inputs, 1, {"num_heads": HEADS, "unidirectional": unidirectional}, ("w", "b"))
    _compare(model, _feeds(inputs, ("w", "b")))


def test_attention_past_present():
    """past -> present during decoding, a custom scale and mask_filter_value."""
    past_length = 3
    inputs = {"x": rand(B, 1, 6), "w": rand(6, 3 * HIDDEN, seed=1), "b": rand(3 * HIDDEN, seed=2),
              "mask": np.ones((B, past_length + 1), np.int32), "past": rand(2, B, HEADS, past_length, SIZE, seed=3)}
    inputs["mask"][1, 0] = 0
    model = _model("Attention", inputs, 2, {"num_heads": HEADS, "unidirectional": 1, "scale": 0.3, "mask_filter_value": -500.0})
    _compare(model, _feeds(inputs))


def test_attention_bias_and_hidden_sizes():
    """attention_bias (onnxruntime allows it without past only); V wider than Q/K; runtime weights."""
    inputs = {"x": rand(B, S, 6), "w": rand(6, 3 * HIDDEN, seed=1), "b": rand(3 * HIDDEN, seed=2),
              "mask": _attention_mask("raw2d"), "past": None, "attention_bias": rand(B, HEADS, S, S, seed=4)}
    _compare(_model("Attention", inputs, 1, {"num_heads": HEADS}), _feeds(inputs))
    inputs = {"x": rand(B, S, 6), "w": rand(6, 8 + 8 + 12, seed=1), "b": rand(28, seed=2)}
    model = _model("Attention", inputs, 1, {"num_heads": HEADS, "qkv_hidden_sizes": [8, 8, 12]}, ("w", "b"))
    _compare(model, _feeds(inputs, ("w", "b")))


def test_attention_refuses_megatron_mask():
    inputs = {"x": rand(B, S, 6), "w": rand(6, 3 * HIDDEN, seed=1), "b": rand(3 * HIDDEN, seed=2),
              "mask": np.ones((B, 1, S, S), np.int32)}
    model = _model("Attention", inputs, 1, {"num_heads": HEADS}, ("w", "b"))
    with pytest.raises(LoweringError, match=r"'node' \(com.microsoft::Attention\).*mask_index of shape \(2, 1, 5, 5\)"):
        run_onnx_case(model, [inputs["x"], inputs["mask"]])


# -- MultiHeadAttention -----------------------------------------------------------------------
@pytest.mark.parametrize("form", ["separate", "cross_bnsh"])
def test_mha_input_forms(form):
    q, k, v = rand(B, S, HIDDEN), rand(B, 6, HIDDEN, seed=1), rand(B, 6, HIDDEN, seed=2)
    if form == "separate":
        inputs = {"q": q, "k": k, "v": v, "bias": rand(3 * HIDDEN, seed=3)}
    else:
        inputs = {"q": q, "k": rand(B, HEADS, 6, SIZE, seed=1), "v": rand(B, HEADS, 6, SIZE, seed=2)}
    _compare(_model("MultiHeadAttention", inputs, 1, {"num_heads": HEADS}), _feeds(inputs))


@pytest.mark.parametrize("form", ["packed_qkv", "packed_kv"])
def test_mha_packed_inputs(form):
    """onnxruntime's CPU kernel has no packed forms: the reference is the same numbers unpacked."""
    length = S if form == "packed_qkv" else 6
    packed = rand(B, length, HEADS, 3 if form == "packed_qkv" else 2, SIZE, seed=1)
    parts = [packed[:, :, :, i].reshape(B, length, HIDDEN) for i in range(packed.shape[3])]
    q = parts[0] if form == "packed_qkv" else rand(B, S, HIDDEN)
    k, v = parts[-2:]
    bias = rand(3 * HIDDEN, seed=3) if form == "packed_qkv" else None
    unpacked = {"q": q, "k": k, "v": v, "bias": bias}
    expected = run_onnxruntime(_model("MultiHeadAttention", unpacked, 1, {"num_heads": HEADS}), _feeds(unpacked))["y"]
    inputs = {"q": packed, "k": None, "v": None, "bias": bias} if form == "packed_qkv" else {"q": q, "k": packed}
    model = _model("MultiHeadAttention", inputs, 1, {"num_heads": HEADS})
    feeds = _feeds(inputs)
    actual = run_onnx_case(model, [feeds[i.name] for i in model.graph.input])[0]
    np.testing.assert_allclose(actual, expected, atol=MAX_ABS)


@pytest.mark.parametrize("mask", ["lengths", "raw2d", "raw3d"])
def test_mha_masks_bias_and_past(mask):
    past_length = 2
    total = past_length + S
    lengths = np.array([total, 4], np.int32)
    raw = (np.arange(total)[None] < lengths[:, None]).astype(np.int32)
    key_padding_mask = {"lengths": lengths, "raw2d": raw, "raw3d": np.repeat(raw[:, None], S, 1)}[mask]
    inputs = {"q": rand(B, S, HIDDEN), "k": rand(B, S, HIDDEN, seed=1), "v": rand(B, S, HIDDEN, seed=2),
              "bias": rand(3 * HIDDEN, seed=3), "key_padding_mask": key_padding_mask,
              "attention_bias": rand(B, 1, S, total, seed=4),
              "past_key": rand(B, HEADS, past_length, SIZE, seed=5), "past_value": rand(B, HEADS, past_length, SIZE, seed=6)}
    model = _model("MultiHeadAttention", inputs, 3, {"num_heads": HEADS, "unidirectional": 1, "mask_filter_value": -1000.0})
    _compare(model, _feeds(inputs))


# -- GroupQueryAttention ----------------------------------------------------------------------
KV_HEADS, Q_HEADS, GQA_SIZE, MAX_POSITIONS = 1, 4, 16, 16  # onnxruntime wants head sizes of 16k


def _rotary_caches(rotary_dim):
    angles = np.arange(MAX_POSITIONS)[:, None] * (10000.0 ** (-np.arange(rotary_dim // 2) * 2.0 / rotary_dim))[None]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _gqa_inputs(*, q_length, past_length, packed=False, rotary_dim=0, seqlens=None, batch=B, head_sink=False):
    inputs = {}
    if packed:
        inputs["query"] = rand(batch, q_length, (Q_HEADS + 2 * KV_HEADS) * GQA_SIZE)
        inputs["key"], inputs["value"] = None, None
    else:
        inputs["query"] = rand(batch, q_length, Q_HEADS * GQA_SIZE)
        inputs["key"], inputs["value"] = rand(batch, q_length, KV_HEADS * GQA_SIZE, seed=1), rand(batch, q_length, KV_HEADS * GQA_SIZE, seed=2)
    if past_length:
        inputs["past_key"] = rand(batch, KV_HEADS, past_length, GQA_SIZE, seed=3)
        inputs["past_value"] = rand(batch, KV_HEADS, past_length, GQA_SIZE, seed=4)
    else:
        inputs["past_key"], inputs["past_value"] = None, None
    total = past_length + q_length
    inputs["seqlens_k"] = np.full(batch, total - 1, np.int32) if seqlens is None else seqlens
    inputs["total_sequence_length"] = np.array(total, np.int32)
    if rotary_dim:
        inputs["cos_cache"], inputs["sin_cache"] = _rotary_caches(rotary_dim)
    if head_sink:  # inputs 9 and 10 (position_ids, attention_bias) stay empty
        inputs.update(cos_cache=None, sin_cache=None, position_ids=None, attention_bias=None, head_sink=rand(Q_HEADS, seed=9))
    return inputs


GQA_CASES = {
    "prompt": ({"q_length": 5, "past_length": 0}, {}),
    "prompt_right_padding": ({"q_length": 5, "past_length": 0, "seqlens": np.array([4, 2], np.int32)}, {}),
    "prompt_packed_rotary": ({"q_length": 5, "past_length": 0, "packed": True, "rotary_dim": GQA_SIZE}, {"do_rotary": 1}),
    "decode_rotary_interleaved": ({"q_length": 1, "past_length": 6, "rotary_dim": GQA_SIZE},
                                  {"do_rotary": 1, "rotary_interleaved": 1}),
    # onnxruntime takes several new tokens after a past only at batch 1
    "chunk_local_window": ({"q_length": 3, "past_length": 5, "batch": 1}, {"local_window_size": 2}),
    "decode_softcap_scale": ({"q_length": 1, "past_length": 4}, {"softcap": 0.5, "scale": 0.7}),
    "prompt_smooth_softmax": ({"q_length": 4, "past_length": 0}, {"smooth_softmax": 1}),
    "prompt_head_sink": ({"q_length": 4, "past_length": 0, "head_sink": True}, {}),
}


@pytest.mark.parametrize("case", sorted(GQA_CASES))
def test_group_query_attention(case):
    shape, attrs = GQA_CASES[case]
    inputs = _gqa_inputs(**shape)
    constants = ("cos_cache", "sin_cache", "total_sequence_length", "head_sink")
    model = _model("GroupQueryAttention", inputs, 3, {"num_heads": Q_HEADS, "kv_num_heads": KV_HEADS, **attrs}, constants)
    feeds = _feeds(inputs, constants)
    if case == "prompt_right_padding":  # onnxruntime leaves the rows of padding tokens unspecified: compare the rest
        expected = run_onnxruntime(model, feeds)
        actual = run_onnx_case(model, [feeds[v.name] for v in model.graph.input])
        for row, length in enumerate(inputs["seqlens_k"] + 1):
            np.testing.assert_allclose(actual[0][row, :length], expected["y0"][row, :length], atol=MAX_ABS)
        return
    _compare(model, feeds)


def test_gqa_refuses_quantized_cache():
    inputs = _gqa_inputs(q_length=1, past_length=2)
    model = _model("GroupQueryAttention", inputs, 3, {"num_heads": Q_HEADS, "kv_num_heads": KV_HEADS, "k_quant_type": "PER_TENSOR"})
    with pytest.raises(LoweringError, match="GroupQueryAttention.*k_quant_type"):
        run_onnx_case(model, [inputs[v.name] for v in model.graph.input])


def test_attention_before_ios18_uses_matmul_softmax():
    """Below iOS18 there is no fused scaled_dot_product_attention: the explicit path must agree."""
    from onnx_cases import lower, lower_and_run

    inputs = {"x": rand(B, S, 6), "w": rand(6, 3 * HIDDEN, seed=1), "b": rand(3 * HIDDEN, seed=2), "mask": _attention_mask("lengths")}
    model = _model("Attention", inputs, 1, {"num_heads": HEADS, "unidirectional": 1}, ("w", "b"))
    ops = {op.op_type for op in lower(model, target="iOS17").program.functions["main"].operations}
    assert "scaled_dot_product_attention" not in ops and "softmax" in ops
    feeds = _feeds(inputs, ("w", "b"))
    np.testing.assert_allclose(lower_and_run(model, feeds, target="iOS17")["y"], run_onnxruntime(model, feeds)["y"], atol=MAX_ABS)
