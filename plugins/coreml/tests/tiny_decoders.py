"""Random-weight decoder LMs from published architectures (transformers' Llama and Qwen2), made on
the fly and exported stateless to ONNX with torch's dynamo exporter, as the pytorch plugin does."""

from __future__ import annotations

import contextlib
import sys
import warnings
from pathlib import Path

ARCHITECTURES = ("llama", "qwen2")


def tiny_decoder(kind: str, *, hidden: int = 128, layers: int = 2, vocab: int = 1024, seed: int = 0):
    """A seeded ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` (2 layers, GQA with 2 KV heads)."""
    import torch
    import transformers

    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  tie_word_embeddings=False)
    torch.manual_seed(seed)
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common)).eval()
    if kind == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common)).eval()
    raise ValueError(f"unknown decoder {kind!r}; one of {ARCHITECTURES}")


def export_decoder(model, path: Path, *, tokens: int) -> Path:
    """``model`` as ONNX at ``path``: input_ids [1, tokens] int64 -> logits, no cache (stateless)."""
    import torch

    class Logits(torch.nn.Module):
        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, input_ids):
            return self.lm(input_ids=input_ids, use_cache=False).logits

    ids = torch.zeros((1, tokens), dtype=torch.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = torch.onnx.export(Logits(model).eval(), (ids,), dynamo=True, optimize=True, verbose=False,
                                     input_names=["input_ids"], output_names=["logits"])
    exported.save(str(path))
    return path
