"""Tiny decoder LLMs exported to ONNX with an explicit KV cache, as optimum lays them out.

A random-weight ``transformers`` causal LM from a published architecture (Llama: 2 layers,
hidden 64, 4 heads, 2 KV heads, vocab 256), seeded, with eager attention. The exported graph
takes ``input_ids`` [B, Q], ``attention_mask`` [B, P+Q], ``position_ids`` [B, Q] and per layer
``past_key_values.{i}.key`` / ``.value`` [B, Hkv, P, D]; it returns ``logits`` [B, Q, V] and
``present.{i}.key`` / ``.value`` [B, Hkv, P+Q, D]. P and Q stay dynamic.

Also: greedy generation with onnxruntime on that graph, feeding past and reading present, the
reference the stateful artifact is checked against.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

LLAMA_TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  rms_norm_eps=1e-5, tie_word_embeddings=False)


def tiny_llama(seed: int = 0):
    """The random-weight LlamaForCausalLM (eval mode, eager attention)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**LLAMA_TINY)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # larger than the init's 0.02 so logits are not all alike
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.15)
    return model


def _flat_cache_module(model):
    import torch
    from transformers import DynamicCache

    layers = model.config.num_hidden_layers

    class FlatCache(torch.nn.Module):
        """The causal LM with its cache as flat tensors: past in, present out."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(layers)])
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=cache, use_cache=True)
            present = []
            for layer in out.past_key_values.layers:
                present += [layer.keys, layer.values]
            return (out.logits, *present)

    return FlatCache()


def cache_names(layers: int) -> tuple[list[str], list[str]]:
    past = [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    present = [f"present.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    return past, present


def export_decoder(path: Path, seed: int = 0) -> Path:
    """Export :func:`tiny_llama` to ``path`` (ONNX, opset 17, the optimum layout)."""
    import torch

    model = tiny_llama(seed)
    config = model.config
    layers, kv_heads = config.num_hidden_layers, config.num_key_value_heads
    head_dim = config.hidden_size // config.num_attention_heads
    past_names, present_names = cache_names(layers)
    batch, past_len, query = 1, 3, 2
    example = (
        torch.randint(0, config.vocab_size, (batch, query)),
        torch.ones(batch, past_len + query, dtype=torch.int64),
        torch.arange(past_len, past_len + query).unsqueeze(0),
        *[torch.randn(batch, kv_heads, past_len, head_dim) for _ in past_names],
    )
    axes = {"input_ids": {0: "batch", 1: "query"}, "attention_mask": {0: "batch", 1: "total"},
            "position_ids": {0: "batch", 1: "query"}, "logits": {0: "batch", 1: "query"}}
    axes.update({name: {0: "batch", 2: "past"} for name in past_names})
    axes.update({name: {0: "batch", 2: "total"} for name in present_names})
    path = Path(path)
    with torch.no_grad():
        torch.onnx.export(_flat_cache_module(model), example, str(path), dynamo=False, opset_version=17,
                          input_names=["input_ids", "attention_mask", "position_ids", *past_names],
                          output_names=["logits", *present_names], dynamic_axes=axes)
    return path


class OnnxGreedy:
    """Greedy generation with onnxruntime on an exported decoder, feeding past and reading present."""

    def __init__(self, path: Path):
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        inputs = {i.name: i for i in self.session.get_inputs()}
        self.past = [name for name in inputs if name.startswith("past_key_values.")]
        self.present = ["present" + name[len("past_key_values"):] for name in self.past]
        shape = inputs[self.past[0]].shape
        self.kv_shape = (shape[1], shape[3])

    def forward(self, tokens: list[int], cache: list[np.ndarray] | None):
        """(logits [Q, V], new cache) for ``tokens`` after ``cache``."""
        heads, dim = self.kv_shape
        if cache is None:
            cache = [np.zeros((1, heads, 0, dim), np.float32) for _ in self.past]
        done = cache[0].shape[2]
        ids = np.asarray([tokens], np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones((1, done + len(tokens)), np.int64),
                 "position_ids": np.arange(done, done + len(tokens), dtype=np.int64)[None],
                 **dict(zip(self.past, cache))}
        logits, *present = self.session.run(["logits", *self.present], feeds)
        return logits[0], present

    def generate(self, prompt: list[int], new_tokens: int) -> tuple[list[int], np.ndarray]:
        logits, cache = self.forward(list(prompt), None)
        step_logits, tokens = [], []
        last = logits[-1]
        for _ in range(new_tokens):
            token = int(np.argmax(last))
            tokens.append(token)
            step_logits.append(last)
            if len(tokens) == new_tokens:
                break
            logits, cache = self.forward([token], cache)
            last = logits[-1]
        return tokens, np.stack(step_logits)
