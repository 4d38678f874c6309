"""The peer benchmarks/llm.py compares against: a Llama block stack written the way coremltools'
stateful-model guide writes a decoder for ``ct.convert`` with ``StateType``.

The KV cache is two registered buffers, ``key_cache`` / ``value_cache`` [layers, 1, kv_heads,
max_context, head_dim], updated in place by slice assignment; the inputs are ``input_ids`` [1, Q] and
an additive ``causal_mask`` [1, 1, Q, end], from whose lengths the number of cached tokens
(end - Q) follows. Parameter names are transformers' LlamaForCausalLM names, so its safetensors
file loads as saved. Grouped-query attention repeats the KV heads with expand + reshape.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=False)


class Mlp(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = Mlp(c["hidden_size"], c["intermediate_size"])


class Body(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


def _rotate_half(x, half: int):
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class GuideLlama(nn.Module):
    def __init__(self, config: dict, max_context: int):
        super().__init__()
        self.config, self.max_context = config, max_context
        self.model = Body(config)
        self.lm_head = nn.Linear(config["hidden_size"], config["vocab_size"], bias=False)

    @staticmethod
    def cache_shape(config: dict, max_context: int) -> tuple[int, ...]:
        head_dim = config["hidden_size"] // config["num_attention_heads"]
        return (config["num_hidden_layers"], 1, config["num_key_value_heads"], max_context, head_dim)

    def make_buffers(self) -> None:
        """The cache and the rotary frequencies, on the CPU (the weights may be assigned later)."""
        shape = self.cache_shape(self.config, self.max_context)
        self.register_buffer("key_cache", torch.zeros(shape))
        self.register_buffer("value_cache", torch.zeros(shape))
        head_dim = shape[-1]
        theta = self.config.get("rope_theta") or self.config["rope_parameters"]["rope_theta"]  # transformers 5
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, input_ids, causal_mask):
        q_len, end = input_ids.shape[-1], causal_mask.shape[-1]
        past = end - q_len
        positions = torch.arange(end, dtype=torch.float32)[past:]
        freqs = positions[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        h = self.model.embed_tokens(input_ids)
        for index, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(1, -1, attn.heads, attn.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(1, -1, attn.kv_heads, attn.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(1, -1, attn.kv_heads, attn.head_dim).transpose(1, 2)
            q = q * cos + _rotate_half(q, attn.head_dim // 2) * sin
            k = k * cos + _rotate_half(k, attn.head_dim // 2) * sin
            self.key_cache[index:index + 1, :, :, past:end, :] = k
            self.value_cache[index:index + 1, :, :, past:end, :] = v
            keys = self.key_cache[index, :, :, :end, :]
            values = self.value_cache[index, :, :, :end, :]
            repeat = attn.heads // attn.kv_heads
            keys = keys[:, :, None].expand(1, attn.kv_heads, repeat, end, attn.head_dim).reshape(
                1, attn.heads, end, attn.head_dim)
            values = values[:, :, None].expand(1, attn.kv_heads, repeat, end, attn.head_dim).reshape(
                1, attn.heads, end, attn.head_dim)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=causal_mask)
            h = h + attn.o_proj(out.transpose(1, 2).reshape(1, -1, attn.heads * attn.head_dim))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.lm_head(self.model.norm(h))


def load_guide(config_path: str, weights_path: str, max_context: int) -> GuideLlama:
    """The guide module with the safetensors weights: built on the meta device and the file's tensors
    assigned, so the weights are held once."""
    from safetensors.torch import load_file

    config = json.loads(Path(config_path).read_text())
    with torch.device("meta"):
        model = GuideLlama(config, max_context)
    model.load_state_dict(load_file(weights_path), assign=True, strict=True)
    model.make_buffers()
    return model.eval()
