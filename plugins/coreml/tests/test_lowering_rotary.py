"""Rotary embeddings (lowering/ops/rotary.py): ONNX RotaryEmbedding (opset 23) and com.microsoft's,
run as ``edgebuild conformance`` runs node cases and compared with onnxruntime on the same model
(cosine >= 0.9999, max-abs bound). The ONNX node cases themselves run under
``edgebuild conformance --ops RotaryEmbedding``.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx_cases import lower, lower_and_run, rand, run_onnxruntime, single_node_model

from edgebuild_coreml.conformance_runner import run_onnx_case
from edgebuild_coreml.lowering.errors import LoweringError

B, S, HEADS, SIZE, MAX_POSITIONS = 2, 5, 2, 8, 16
MAX_ABS = 1e-5


def _caches(rotary_dim):
    angles = np.arange(MAX_POSITIONS)[:, None] * (10000.0 ** (-np.arange(rotary_dim // 2) * 2.0 / rotary_dim))[None]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _compare(model, feeds):
    expected = run_onnxruntime(model, feeds)["y"].astype(np.float64)
    actual = run_onnx_case(model, [feeds[v.name] for v in model.graph.input])[0].astype(np.float64)
    assert actual.shape == expected.shape
    cosine = actual.ravel() @ expected.ravel() / (np.linalg.norm(actual) * np.linalg.norm(expected))
    assert cosine >= 0.9999 and np.max(np.abs(actual - expected)) <= MAX_ABS


def _run(op_inputs, attrs, *, domain="", constants=("cos", "sin")):
    model = single_node_model("RotaryEmbedding", op_inputs, attrs=attrs, opset=23, domain=domain, initializers=constants)
    _compare(model, {k: v for k, v in op_inputs.items() if v is not None and k not in constants})


@pytest.mark.parametrize("layout", ["bsh", "bnsh"])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rotary_dim", [0, 4])
def test_onnx_rotary_embedding_with_position_ids(layout, interleaved, rotary_dim):
    cos, sin = _caches(rotary_dim or SIZE)
    x = rand(B, S, HEADS * SIZE) if layout == "bsh" else rand(B, HEADS, S, SIZE)
    positions = np.array([[0, 1, 2, 3, 4], [6, 7, 8, 9, 10]], np.int64)
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": rotary_dim, **({"num_heads": HEADS} if layout == "bsh" else {})}
    _run({"x": x, "cos": cos, "sin": sin, "position_ids": positions}, attrs)


def test_onnx_rotary_embedding_batched_caches():
    """Without position_ids the caches come per batch and token, (B, S, R/2), at run time."""
    cos, sin = _caches(SIZE)
    rows = np.array([[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]])
    _run({"x": rand(B, HEADS, S, SIZE), "cos": cos[rows], "sin": sin[rows]}, {}, constants=())


@pytest.mark.parametrize("layout", ["bsh", "bnsh"])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("positions", ["offset", "explicit"])
def test_microsoft_rotary_embedding(layout, interleaved, positions):
    cos, sin = _caches(SIZE)
    x = rand(B, S, HEADS * SIZE) if layout == "bsh" else rand(B, HEADS, S, SIZE)
    position_ids = np.array([3], np.int64) if positions == "offset" else np.array([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]], np.int64)
    _run({"x": x, "position_ids": position_ids, "cos": cos, "sin": sin}, {"interleaved": interleaved}, domain="com.microsoft")


def test_microsoft_rotary_embedding_partial():
    cos, sin = _caches(4)
    inputs = {"x": rand(B, S, HEADS * SIZE), "position_ids": np.array([[0, 1, 2, 3, 4]] * B, np.int64), "cos": cos, "sin": sin}
    _run(inputs, {"num_heads": HEADS, "rotary_embedding_dim": 4}, domain="com.microsoft")


def test_microsoft_rotary_embedding_refuses_packed_batching():
    cos, sin = _caches(SIZE)
    inputs = {"x": rand(B, S, HEADS * SIZE), "position_ids": np.array([0], np.int64), "cos": cos, "sin": sin}
    model = single_node_model("RotaryEmbedding", inputs, attrs={"is_packed_batching": 1}, domain="com.microsoft",
                              initializers=("cos", "sin"))
    with pytest.raises(LoweringError, match=r"'node' \(com.microsoft::RotaryEmbedding\).*is_packed_batching"):
        run_onnx_case(model, [inputs["x"], inputs["position_ids"]])


def _dynamic(model, symbols):
    """``model`` with the leading dims of its graph inputs named (unknown until run time), as a
    decoder exports batch and sequence lengths."""
    for value in model.graph.input:
        for dim, symbol in zip(value.type.tensor_type.shape.dim, symbols.get(value.name, ())):
            dim.ClearField("dim_value")
            dim.dim_param = symbol
    return model


@pytest.mark.parametrize("domain", ["", "com.microsoft"])
@pytest.mark.parametrize("layout", ["bsh", "bnsh"])
@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_embedding_with_dynamic_batch_and_sequence(domain, layout, interleaved):
    """Only the head size is static: batch and sequence lengths known at run time, as in decoders."""
    cos, sin = _caches(SIZE)
    x = rand(B, S, HEADS * SIZE) if layout == "bsh" else rand(B, HEADS, S, SIZE)
    positions = np.array([[0, 1, 2, 3, 4], [6, 7, 8, 9, 10]], np.int64)
    if domain:  # com.microsoft's inputs: x, position_ids (here the first position), cos, sin
        inputs = {"x": x, "position_ids": np.array([3], np.int64), "cos": cos, "sin": sin}
    else:
        inputs = {"x": x, "cos": cos, "sin": sin, "position_ids": positions}
    attrs = {"interleaved": interleaved, **({"num_heads": HEADS} if layout == "bsh" else {})}
    model = single_node_model("RotaryEmbedding", inputs, attrs=attrs, opset=23, domain=domain,
                              initializers=("cos", "sin"))
    model = _dynamic(model, {"x": ("batch", "sequence"), "position_ids": () if domain else ("batch", "sequence")})
    if layout == "bnsh":  # (batch, heads, sequence, head): the heads stay static, the sequence is the third
        dims = model.graph.input[0].type.tensor_type.shape.dim
        dims[1].dim_value, dims[2].dim_param = HEADS, "sequence"
    program = lower(model).program.functions["main"]
    assert not all(isinstance(d, int) for d in program.inputs["x"].shape)
    feeds = {k: v for k, v in inputs.items() if k not in ("cos", "sin")}
    expected = run_onnxruntime(model, feeds)["y"]
    for length in (S, 1):  # a prefill and one decode step through the same program
        cut = {k: (v[..., :length] if k == "position_ids" and v.ndim == 2 else v) for k, v in feeds.items()}
        cut["x"] = feeds["x"][:, :length] if layout == "bsh" else feeds["x"][:, :, :length]
        want = run_onnxruntime(model, cut)["y"] if length != S else expected
        got = lower_and_run(model, cut)["y"]
        assert got.shape == want.shape and np.max(np.abs(got - want)) <= MAX_ABS
