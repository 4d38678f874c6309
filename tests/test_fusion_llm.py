"""Decoder-LLM fusion rules on small graphs written as torch's exporter writes them (the
per-family checks on exported transformers models are in the coreml plugin's test_llm_fusions.py)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import onnxscript.optimizer
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgebuild.graph.fusion import PASSES

F = TensorProto.FLOAT


def _model(nodes, inits, shape, opset=18):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, shape)],
                              [helper.make_tensor_value_info("y", F, shape)],
                              [numpy_helper.from_array(np.asarray(a), n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _fuse_and_compare(model, pass_name, x):
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    fused = ir.from_proto(model)
    onnxscript.optimizer.optimize_ir(fused)  # as the optimise stage does before its passes
    fired = PASSES[pass_name].apply(fused)
    actual = ort.InferenceSession(ir.to_proto(fused).SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)
    return fired, [n.op_type for n in fused.graph]


def test_rms_norm():
    nodes = [helper.make_node("Pow", ["x", "two"], ["sq"]), helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1, noop_with_empty_axes=0),
             helper.make_node("Add", ["ms", "eps"], ["mse"]), helper.make_node("Sqrt", ["mse"], ["rms"]),
             helper.make_node("Reciprocal", ["rms"], ["inv"]), helper.make_node("Mul", ["x", "inv"], ["n"]),
             helper.make_node("Mul", ["w", "n"], ["y"])]
    inits = {"two": np.float32(2), "axes": np.array([-1]), "eps": np.float32(1e-6),
             "w": np.random.default_rng(1).uniform(0.5, 1.5, 8).astype(np.float32)}
    x = np.random.default_rng(0).standard_normal((1, 4, 8)).astype(np.float32)
    fired, ops = _fuse_and_compare(_model(nodes, inits, [1, 4, 8]), "fuse_rms_norm", x)
    assert fired == 1 and ops == ["SimplifiedLayerNormalization"]


def _rotary_nodes(x: str, out: str, size: int, interleaved: bool) -> tuple[list, dict]:
    """``x`` (B, H, S, size) rotated as transformers writes it (rotate_half or rotate_every_two)."""
    inits = {"axes": np.array([3]), "one": np.array([1]), "two": np.array([2]), "zero": np.array([0]),
             "half": np.array([size // 2]), "end": np.array([2 ** 63 - 1]), "last": np.array([-1])}
    if interleaved:
        rotate = [helper.make_node("Slice", [x, "zero", "end", "axes", "two"], ["even"]),
                  helper.make_node("Slice", [x, "one", "end", "axes", "two"], ["odd"]),
                  helper.make_node("Neg", ["odd"], ["neg"]),
                  helper.make_node("Unsqueeze", ["neg", "last"], ["a"]), helper.make_node("Unsqueeze", ["even", "last"], ["b"]),
                  helper.make_node("Concat", ["a", "b"], ["ab"], axis=-1), helper.make_node("Reshape", ["ab", "rshape"], ["rot"])]
    else:
        rotate = [helper.make_node("Slice", [x, "zero", "half", "axes", "one"], ["first"]),
                  helper.make_node("Slice", [x, "half", "end", "axes", "one"], ["second"]),
                  helper.make_node("Neg", ["second"], ["neg"]), helper.make_node("Concat", ["neg", "first"], ["rot"], axis=-1)]
    nodes = [helper.make_node("Mul", [x, "cos"], ["xc"]), *rotate, helper.make_node("Mul", ["rot", "sin"], ["rs"]),
             helper.make_node("Add", ["xc", "rs"], [out])]
    return nodes, inits


def _tables(length: int, size: int, interleaved: bool) -> dict:
    angles = np.arange(length)[:, None] * (1e-1 ** (np.arange(size // 2) / (size // 2)))[None]
    pairs = np.repeat(angles, 2, axis=-1) if interleaved else np.concatenate([angles, angles], -1)
    return {"cos": np.cos(pairs)[None, None].astype(np.float32), "sin": np.sin(pairs)[None, None].astype(np.float32)}


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary(interleaved):
    batch, heads, length, size = 1, 2, 5, 8
    nodes, inits = _rotary_nodes("x", "y", size, interleaved)
    inits.update(_tables(length, size, interleaved), rshape=np.array([batch, heads, length, size]))
    x = np.random.default_rng(0).standard_normal((batch, heads, length, size)).astype(np.float32)
    fired, ops = _fuse_and_compare(_model(nodes, inits, [batch, heads, length, size]), "fuse_rotary", x)
    assert fired == 1 and ops == ["RotaryEmbedding"]


@pytest.mark.parametrize("interleaved", [False, True])
def test_partial_rotary(interleaved):
    """GPT-NeoX / Phi-2 / StableLM's partial_rotary_factor: the first 8 of 12 channels rotated, the
    rest passed through -> one RotaryEmbedding with rotary_embedding_dim 8 on the whole head."""
    batch, heads, length, size, rotary_dim = 1, 2, 5, 12, 8
    nodes, inits = _rotary_nodes("x_rot", "rotated", rotary_dim, interleaved)
    nodes = [helper.make_node("Slice", ["x", "zero", "cut", "axes", "one"], ["x_rot"]),
             helper.make_node("Slice", ["x", "cut", "end", "axes", "one"], ["x_pass"]), *nodes,
             helper.make_node("Concat", ["rotated", "x_pass"], ["y"], axis=-1)]
    inits.update(_tables(length, rotary_dim, interleaved), cut=np.array([rotary_dim]),
                 rshape=np.array([batch, heads, length, rotary_dim]))
    x = np.random.default_rng(0).standard_normal((batch, heads, length, size)).astype(np.float32)
    fired, ops = _fuse_and_compare(_model(nodes, inits, [batch, heads, length, size]), "fuse_rotary", x)
    assert fired == 2 and ops == ["RotaryEmbedding"]  # the rotated part, then the whole head


def _repeat_kv(name: str) -> list:
    """torch's repeat_kv as exported: Unsqueeze -> Expand -> Reshape to the query head count."""
    return [helper.make_node("Unsqueeze", [name, "axis2"], [f"{name}_u"]),
            helper.make_node("Expand", [f"{name}_u", f"{name}_expand"], [f"{name}_e"]),
            helper.make_node("Reshape", [f"{name}_e", f"{name}_shape"], [f"{name}_rep"])]


@pytest.mark.parametrize("fused_attention", [True, False])
def test_grouped_query_attention_reads_shared_kv_heads(fused_attention):
    """4 query heads on 2 K/V heads: no Expand remains, numbers unchanged (fused op or explicit MatMuls)."""
    from edgebuild.graph import fused_reference

    heads, kv_heads, q_len, kv_len, size = 4, 2, 3, 5, 8
    group = heads // kv_heads
    nodes = [*_repeat_kv("k"), *_repeat_kv("v"),
             helper.make_node("Transpose", ["k_rep"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Mul", ["s", "scale"], ["ss"]),
             helper.make_node("Softmax", ["ss"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v_rep"], ["y"])]
    inits = [numpy_helper.from_array(a, n) for n, a in {
        "axis2": np.array([2]), "scale": np.float32(size ** -0.5),
        "k_expand": np.array([1, kv_heads, group, kv_len, size]), "k_shape": np.array([1, heads, kv_len, size]),
        "v_expand": np.array([1, kv_heads, group, kv_len, size]), "v_shape": np.array([1, heads, kv_len, size])}.items()]
    inputs = [helper.make_tensor_value_info("q", F, [1, heads, q_len, size]),
              helper.make_tensor_value_info("k", F, [1, kv_heads, kv_len, size]),
              helper.make_tensor_value_info("v", F, [1, kv_heads, kv_len, size])]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", F, [1, heads, q_len, size])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    rng = np.random.default_rng(0)
    feeds = {"q": rng.standard_normal((1, heads, q_len, size)).astype(np.float32),
             "k": rng.standard_normal((1, kv_heads, kv_len, size)).astype(np.float32),
             "v": rng.standard_normal((1, kv_heads, kv_len, size)).astype(np.float32)}
    expected = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    fused = ir.from_proto(model)
    onnxscript.optimizer.optimize_ir(fused)
    if fused_attention:
        assert PASSES["fuse_attention"].apply(fused) == 1
    fired = PASSES["fuse_grouped_query_attention"].apply(fused)
    ops = [n.op_type for n in fused.graph]
    assert "Expand" not in ops
    if fused_attention:
        assert fired == 1 and ops.count("ScaledDotProductAttention") == 1
        actual = fused_reference.run_reference(fused, feeds)["y"]
    else:
        assert fired == 2  # the scores MatMul and the values MatMul
        actual = ort.InferenceSession(ir.to_proto(fused).SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


def test_tied_lm_head_reads_the_embedding_table():
    vocab, hidden = 12, 8
    table = np.random.default_rng(0).standard_normal((vocab, hidden)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["h"]), helper.make_node("Transpose", ["table"], ["tt"], perm=[1, 0]),
             helper.make_node("MatMul", ["h", "tt"], ["logits"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3])],
                              [helper.make_tensor_value_info("logits", F, [1, 3, vocab])],
                              [numpy_helper.from_array(table, "table")])
    fused = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    assert PASSES["share_tied_embeddings"].apply(fused) == 1
    linear = next(n for n in fused.graph if n.op_type == "Linear")
    # Linear's weight is [in, out]: the table read through a Transpose, so a backend's [out, in]
    # layout of it is the table itself, and the graph holds the table once
    reader = linear.inputs[1].producer()
    assert reader.op_type == "Transpose" and list(reader.attributes["perm"].as_ints()) == [1, 0]
    assert reader.inputs[0] is fused.graph.initializers["table"]
    assert list(fused.graph.initializers) == ["table"]


def test_gated_mlp():
    from edgebuild.graph import fused_reference

    rng = np.random.default_rng(0)
    weights = {"wg": rng.standard_normal((8, 16)), "wu": rng.standard_normal((8, 16)), "wd": rng.standard_normal((16, 8))}
    nodes = [helper.make_node("MatMul", ["x", "wg"], ["g"]), helper.make_node("Sigmoid", ["g"], ["sg"]),
             helper.make_node("Mul", ["g", "sg"], ["silu"]), helper.make_node("MatMul", ["x", "wu"], ["u"]),
             helper.make_node("Mul", ["silu", "u"], ["h"]), helper.make_node("MatMul", ["h", "wd"], ["y"])]
    model = _model(nodes, {n: w.astype(np.float32) for n, w in weights.items()}, [1, 4, 8])
    x = rng.standard_normal((1, 4, 8)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    fused = ir.from_proto(model)
    onnxscript.optimizer.optimize_ir(fused)
    for name in ("fuse_bias", "fuse_activations"):
        PASSES[name].apply(fused)
    assert PASSES["fuse_gated_mlp"].apply(fused) == 1
    assert sorted(n.op_type for n in fused.graph) == ["Linear", "Linear", "Linear", "SwiGLU"]
    np.testing.assert_allclose(fused_reference.run_reference(fused, {"x": x})["y"], expected, rtol=1e-4, atol=1e-5)


def test_grouped_query_through_soft_capping_with_a_dynamic_cache():
    """Gemma-2's attention (tanh soft-capping between the scores and the softmax, so no fused
    attention op) over a cache of dynamic length and batch: repeat_kv's shapes are built from
    Shape ops there. Both MatMuls read the shared K/V heads; numbers as onnxruntime's at two lengths."""
    heads, kv_heads, size, cap = 4, 2, 8, 50.0
    group = heads // kv_heads
    nodes = [helper.make_node("Shape", ["k"], ["batch"], start=0, end=1),
             helper.make_node("Shape", ["k"], ["length"], start=2, end=3)]
    for name in ("k", "v"):
        nodes += [helper.make_node("Concat", ["batch", "kv_heads", "group", "length", "size"], [f"{name}_expand"], axis=0),
                  helper.make_node("Concat", ["batch", "heads", "length", "size"], [f"{name}_shape"], axis=0),
                  *_repeat_kv(name)]
    nodes += [helper.make_node("Transpose", ["k_rep"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Mul", ["s", "scale"], ["ss"]),
              helper.make_node("Div", ["ss", "cap"], ["sc"]), helper.make_node("Tanh", ["sc"], ["t"]),
              helper.make_node("Mul", ["t", "cap"], ["capped"]),
              helper.make_node("Softmax", ["capped"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v_rep"], ["y"])]
    inits = [numpy_helper.from_array(a, n) for n, a in {
        "axis2": np.array([2]), "scale": np.float32(size ** -0.5), "cap": np.float32(cap),
        "kv_heads": np.array([kv_heads]), "group": np.array([group]), "heads": np.array([heads]),
        "size": np.array([size])}.items()]
    inputs = [helper.make_tensor_value_info("q", F, ["B", heads, "S", size]),
              helper.make_tensor_value_info("k", F, ["B", kv_heads, "T", size]),
              helper.make_tensor_value_info("v", F, ["B", kv_heads, "T", size])]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", F, ["B", heads, "S", size])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    fused = ir.from_proto(model)
    onnxscript.optimizer.optimize_ir(fused)
    assert PASSES["fuse_attention"].apply(fused) == 0  # soft-capping is not scaled_dot_product_attention
    assert PASSES["fuse_grouped_query_attention"].apply(fused) == 2  # the scores MatMul and the values MatMul
    assert "Expand" not in [n.op_type for n in fused.graph]
    source = ort.InferenceSession(model.SerializeToString())
    grouped = ort.InferenceSession(ir.to_proto(fused).SerializeToString())
    rng = np.random.default_rng(0)
    for batch, q_len, kv_len in ((1, 1, 9), (2, 5, 5)):
        feeds = {"q": rng.standard_normal((batch, heads, q_len, size)).astype(np.float32) * 4,
                 "k": rng.standard_normal((batch, kv_heads, kv_len, size)).astype(np.float32) * 4,
                 "v": rng.standard_normal((batch, kv_heads, kv_len, size)).astype(np.float32)}
        np.testing.assert_allclose(grouped.run(None, feeds)[0], source.run(None, feeds)[0], rtol=1e-5, atol=1e-6)
