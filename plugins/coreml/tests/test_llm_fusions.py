"""Decoder-LLM fusions on real transformers architectures (random weights, published configs'
structure, 2 layers, hidden 64), exported as the pytorch plugin exports (torch's dynamo exporter).

Per family: the fusion counts the optimise stage reports; the fused graph evaluated by onnx's
reference evaluator with edgebuild's op definitions equals onnxruntime on the source; the
Core ML program (fp32, iOS18 and iOS17) run by the MIL interpreter matches onnxruntime; and
grouped-query attention leaves no tile of K/V in the program.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx_cases import lower, lower_and_run

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SEQUENCE, VOCAB = 16, 256
COMMON = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
          "vocab_size": VOCAB, "max_position_embeddings": 64}

# family -> (config, the fusion counts the optimise stage must report)
FAMILIES = {
    "llama": (lambda: transformers.LlamaConfig(num_key_value_heads=2, **COMMON),
              {"fuse_rms_norm": 5, "fuse_rotary": 4, "fuse_attention": 2, "fuse_grouped_query_attention": 2,
               "fuse_gated_mlp": 2}),
    "qwen2": (lambda: transformers.Qwen2Config(num_key_value_heads=2, **COMMON),
              {"fuse_rms_norm": 5, "fuse_rotary": 4, "fuse_attention": 2, "fuse_grouped_query_attention": 2,
               "fuse_gated_mlp": 2}),
    # Phi-3 projects gate and up at once and splits them
    "phi3": (lambda: transformers.Phi3Config(num_key_value_heads=2, pad_token_id=0, **COMMON),
             {"fuse_rms_norm": 5, "fuse_rotary": 4, "fuse_attention": 2, "fuse_grouped_query_attention": 2,
              "fuse_gated_mlp": 2}),
    # Gemma-2 soft-caps its attention logits (tanh), which the fused attention does not cover: its two
    # explicit MatMuls per layer read the shared K/V heads instead
    "gemma2": (lambda: transformers.Gemma2Config(num_key_value_heads=2, head_dim=16, **COMMON),
               {"fuse_rms_norm": 9, "fuse_rotary": 4, "fuse_attention": 0, "fuse_grouped_query_attention": 4,
                "share_tied_embeddings": 1}),
    # GPT-J rotates interleaved pairs, in (B, S, H, D) layout
    "gptj": (lambda: transformers.GPTJConfig(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64,
                                             rotary_dim=16),
             {"fuse_rms_norm": 0, "fuse_rotary": 4, "fuse_attention": 2}),
    # StableLM (GPT-NeoX style) rotates only the first half of each head (partial_rotary_factor): per
    # rotated tensor the rotated part fuses, then the pass-through joins it (rotary_embedding_dim)
    "stablelm": (lambda: transformers.StableLmConfig(num_key_value_heads=2, partial_rotary_factor=0.5, **COMMON),
                 {"fuse_rms_norm": 0, "fuse_rotary": 8, "fuse_attention": 2, "fuse_grouped_query_attention": 2,
                  "fuse_gated_mlp": 2}),
    "gpt2": (lambda: transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64),
             {"fuse_rms_norm": 0, "fuse_rotary": 0, "fuse_attention": 2}),
}


# without fuse_attention, the grouped-query rules regroup the explicit MatMuls (standard ops)
ONNXRUNTIME_PASSES = ("fuse_rms_norm", "fuse_rotary", "fuse_layer_norm", "fuse_conv_bn", "fuse_grouped_query_attention")
PASS_NAMES = ("fuse_conv_bn", "fuse_bias", "fuse_activations", "fuse_layer_norm", "fuse_attention", "fuse_rms_norm",
              "fuse_rotary", "fuse_grouped_query_attention", "share_tied_embeddings", "fuse_gated_mlp")


class _Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


def _export(family: str, path) -> None:
    torch.manual_seed(0)
    config = FAMILIES[family][0]()
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    ids = torch.zeros((1, SEQUENCE), dtype=torch.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(_Logits(model), (ids,), dynamo=True, opset_version=18, optimize=True,
                                    verbose=False, input_names=["input_ids"], output_names=["logits"])
    program.save(str(path))


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_decoder_fusions(family, tmp_path):
    import onnx
    import onnxruntime as ort

    from edgebuild.graph import fused_reference
    from edgebuild.graph.optimize import optimize

    source = tmp_path / "model.onnx"
    _export(family, source)
    report = optimize(source, tmp_path / "optimized")
    for name, count in FAMILIES[family][1].items():
        assert report["rules"][name] == count, (name, report["rules"])

    ids = np.random.default_rng(0).integers(0, VOCAB, (1, SEQUENCE)).astype(np.int64)
    expected = ort.InferenceSession(str(source)).run(None, {"input_ids": ids})[0]
    # onnxruntime runs the standard ops the LLM passes write; the edgebuild:: ones need onnx's evaluator
    ort_passes = {name: name in ONNXRUNTIME_PASSES for name in PASS_NAMES}
    standard_report = optimize(source, tmp_path / "standard_ops", passes=ort_passes)
    if report["rules"].get("fuse_grouped_query_attention"):
        assert "Expand" not in standard_report["op_counts_after"]  # repeat_kv is gone there too
    standard = ort.InferenceSession(str(tmp_path / "standard_ops" / "model.onnx")).run(None, {"input_ids": ids})[0]
    assert _cosine(standard, expected) >= 0.99999
    fused_path = tmp_path / "optimized" / "model.onnx"
    if family != "gptj":  # onnx's evaluator fails on GPT-J's GatherElements of its sin/cos table
        fused = next(iter(fused_reference.run_reference(fused_path, {"input_ids": ids}).values()))
        assert _cosine(fused, expected) >= 0.99999

    proto = onnx.load(fused_path)
    for target in ("iOS18", "iOS17"):
        ops = [op.op_type for op in lower(proto, target=target).program.functions["main"].operations]
        if report["rules"].get("fuse_attention"):
            assert ops.count("scaled_dot_product_attention") == (2 if target == "iOS18" else 0)
        if report["rules"].get("fuse_grouped_query_attention"):
            assert "tile" not in ops  # K/V are never repeated to the query head count
        actual = next(iter(lower_and_run(proto, {"input_ids": ids}, target=target).values()))
        assert _cosine(actual, expected) >= 0.9999, target


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "gemma2"])
def test_tied_embedding_table_is_stored_once(family, tmp_path):
    """The LM head reads the embedding table: the package's weights hold about one copy of it."""
    import onnx

    from edgebuild.graph.optimize import optimize
    from edgebuild_coreml.lowering.package import save_mlpackage

    source = tmp_path / "model.onnx"
    _export(family, source)
    report = optimize(source, tmp_path / "optimized")
    assert report["rules"]["share_tied_embeddings"] == 1
    result = lower(onnx.load(tmp_path / "optimized" / "model.onnx"), target="iOS18")
    save_mlpackage(result, tmp_path / "model.mlpackage", target="iOS18", precision="float32", metadata={}, consume=True)
    weights = next((tmp_path / "model.mlpackage").rglob("weight.bin")).stat().st_size
    source_bytes = sum(int(np.prod(t.dims)) * 4 for t in onnx.load(source).graph.initializer)
    table_bytes = VOCAB * 64 * 4
    assert weights < source_bytes + table_bytes / 2, (weights, source_bytes)


PAST, QUERY, KV_HEADS, HEAD_SIZE = 8, 4, 2, 16


class _WithCache(torch.nn.Module):
    """The optimum layout: input_ids, attention_mask, past_key_values.{i}.key/value ->
    logits, present.{i}.key/value (past concatenated with the new K/V)."""

    def __init__(self, model, config):
        super().__init__()
        self.model, self.config = model, config

    def forward(self, input_ids, attention_mask, *past):
        cache = transformers.DynamicCache(config=self.config)
        for layer in range(len(past) // 2):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
        present = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
        return (out.logits, *present)


def _cache_names(prefix: str) -> list[str]:
    return [f"{prefix}.{i}.{kv}" for i in range(2) for kv in ("key", "value")]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_decoder_fusions_with_past_cache(family, tmp_path):
    """Attention after a KV cache (Concat of past and new K/V) fuses the same way; the
    program tiles at most the small mask over a query group, never K/V."""
    import onnx
    import onnxruntime as ort

    from edgebuild.graph import fused_reference
    from edgebuild.graph.optimize import optimize

    torch.manual_seed(0)
    config = FAMILIES[family][0]()
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    past = [torch.randn(1, KV_HEADS, PAST, HEAD_SIZE) for _ in range(4)]
    example = (torch.zeros(1, QUERY, dtype=torch.int64), torch.ones(1, PAST + QUERY, dtype=torch.int64), *past)
    source = tmp_path / "model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(_WithCache(model, config), example, dynamo=True, opset_version=18, optimize=True,
                                    verbose=False, input_names=["input_ids", "attention_mask", *_cache_names("past_key_values")],
                                    output_names=["logits", *_cache_names("present")])
    program.save(str(source))
    report = optimize(source, tmp_path / "optimized")
    for name, count in FAMILIES[family][1].items():
        assert report["rules"][name] == count, (name, report["rules"])

    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, VOCAB, (1, QUERY)), "attention_mask": np.ones((1, PAST + QUERY), np.int64)}
    feeds.update({name: rng.standard_normal((1, KV_HEADS, PAST, HEAD_SIZE)).astype(np.float32)
                  for name in _cache_names("past_key_values")})
    session = ort.InferenceSession(str(source))
    names = [o.name for o in session.get_outputs()]
    expected = dict(zip(names, session.run(None, feeds)))
    fused_path = tmp_path / "optimized" / "model.onnx"
    fused = fused_reference.run_reference(fused_path, feeds)
    for name in names:
        assert _cosine(fused[name], expected[name]) >= 0.99999, name

    proto = onnx.load(fused_path)
    for target in ("iOS18", "iOS17"):
        operations = lower(proto, target=target).program.functions["main"].operations
        assert [op.op_type for op in operations].count("scaled_dot_product_attention") == (2 if target == "iOS18" else 0)
        assert not [op for op in operations if op.op_type == "tile" and op.inputs["x"].shape[-1] == HEAD_SIZE]
        actual = lower_and_run(proto, feeds, target=target)
        for name in names:
            assert _cosine(actual[name], expected[name]) >= 0.9999, (target, name)
