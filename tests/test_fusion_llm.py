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


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary(interleaved):
    batch, heads, length, size = 1, 2, 5, 8
    angles = np.arange(length)[:, None] * (1e-1 ** (np.arange(size // 2) / (size // 2)))[None]
    pairs = np.repeat(angles, 2, axis=-1) if interleaved else np.concatenate([angles, angles], -1)
    inits = {"cos": np.cos(pairs)[None, None].astype(np.float32), "sin": np.sin(pairs)[None, None].astype(np.float32),
             "axes": np.array([3]), "one": np.array([1]), "two": np.array([2]), "zero": np.array([0]),
             "half": np.array([size // 2]), "end": np.array([2 ** 63 - 1]), "last": np.array([-1]),
             "shape": np.array([batch, heads, length, size])}
    if interleaved:
        rotate = [helper.make_node("Slice", ["x", "zero", "end", "axes", "two"], ["even"]),
                  helper.make_node("Slice", ["x", "one", "end", "axes", "two"], ["odd"]),
                  helper.make_node("Neg", ["odd"], ["neg"]),
                  helper.make_node("Unsqueeze", ["neg", "last"], ["a"]), helper.make_node("Unsqueeze", ["even", "last"], ["b"]),
                  helper.make_node("Concat", ["a", "b"], ["ab"], axis=-1), helper.make_node("Reshape", ["ab", "shape"], ["rot"])]
    else:
        rotate = [helper.make_node("Slice", ["x", "zero", "half", "axes", "one"], ["first"]),
                  helper.make_node("Slice", ["x", "half", "end", "axes", "one"], ["second"]),
                  helper.make_node("Neg", ["second"], ["neg"]), helper.make_node("Concat", ["neg", "first"], ["rot"], axis=-1)]
    nodes = [helper.make_node("Mul", ["x", "cos"], ["xc"]), *rotate, helper.make_node("Mul", ["rot", "sin"], ["rs"]),
             helper.make_node("Add", ["xc", "rs"], ["y"])]
    x = np.random.default_rng(0).standard_normal((batch, heads, length, size)).astype(np.float32)
    fired, ops = _fuse_and_compare(_model(nodes, inits, [batch, heads, length, size]), "fuse_rotary", x)
    assert fired == 1 and ops == ["RotaryEmbedding"]
