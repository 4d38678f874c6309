"""A Llama-style decoder written as one generation step with its KV cache explicit, for jax.export.

``step(params, input_ids, position, *cache) -> (logits, *new_cache)``: ``input_ids`` [1, Q] int32
(Q fixed at 1, or symbolic for a multi-token prefill), ``position`` a 0-d int32 (tokens already in
the cache), and per layer a key and a value cache [1, kv_heads, max_context, head_dim]. The new
rows are written into the cache with ``lax.dynamic_update_slice`` at ``position``, and every query
attends to the cache rows at or before its own position, so the step is a pure function a runtime
can hold the cache for.

The shapes follow TinyLlama-1.1B's published configuration (RMSNorm eps 1e-5, rotary base 10000,
grouped-query attention, SwiGLU with an intermediate width 2.75 times the hidden width) scaled down
to 2 layers, hidden 64 and a 256-token vocabulary; the weights are seeded random normals.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax


@dataclass(frozen=True)
class Config:
    vocab: int = 256
    hidden: int = 64
    intermediate: int = 176
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    max_context: int = 32
    rope_theta: float = 10000.0
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def random_params(config: Config, seed: int = 0) -> dict:
    """Normal weights scaled by 1/sqrt(fan-in), norms at one: a stand-in for a trained checkpoint."""
    rng = np.random.default_rng(seed)

    def dense(fan_in, fan_out):
        return (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)

    c, d = config, config.head_dim
    layers = [{
        "attention_norm": np.ones(c.hidden, np.float32),
        "wq": dense(c.hidden, c.heads * d), "wk": dense(c.hidden, c.kv_heads * d),
        "wv": dense(c.hidden, c.kv_heads * d), "wo": dense(c.heads * d, c.hidden),
        "mlp_norm": np.ones(c.hidden, np.float32),
        "gate": dense(c.hidden, c.intermediate), "up": dense(c.hidden, c.intermediate),
        "down": dense(c.intermediate, c.hidden),
    } for _ in range(c.layers)]
    return {"embed": rng.standard_normal((c.vocab, c.hidden)).astype(np.float32), "layers": layers,
            "norm": np.ones(c.hidden, np.float32), "lm_head": dense(c.hidden, c.vocab)}


def rms_norm(x, scale, eps):
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def rotary(x, positions, theta):
    """Half-split rotary embedding of x [1, Q, heads, D] at ``positions`` [Q]."""
    half = x.shape[-1] // 2
    frequencies = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = (positions.astype(jnp.float32)[:, None] * frequencies)[None, :, None, :]
    sin, cos = jnp.sin(angles), jnp.cos(angles)
    first, second = x[..., :half], x[..., half:]
    return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def attention(config: Config, layer: dict, x, positions, position, key_cache, value_cache):
    c, d = config, config.head_dim
    q_len = x.shape[1]
    q = rotary((x @ layer["wq"]).reshape(1, q_len, c.heads, d), positions, c.rope_theta)
    k = rotary((x @ layer["wk"]).reshape(1, q_len, c.kv_heads, d), positions, c.rope_theta)
    v = (x @ layer["wv"]).reshape(1, q_len, c.kv_heads, d)
    at = (0, 0, position, 0)
    key_cache = lax.dynamic_update_slice(key_cache, k.transpose(0, 2, 1, 3).astype(key_cache.dtype), at)
    value_cache = lax.dynamic_update_slice(value_cache, v.transpose(0, 2, 1, 3).astype(value_cache.dtype), at)
    group = c.heads // c.kv_heads
    grouped = q.reshape(1, q_len, c.kv_heads, group, d)
    scores = jnp.einsum("bqhgd,bhkd->bhgqk", grouped, key_cache.astype(q.dtype)) / np.sqrt(d)
    # a query sees the cache rows up to its own position; the rows after it are empty or stale
    visible = jnp.arange(c.max_context)[None, :] <= positions[:, None]
    scores = jnp.where(visible, scores, jnp.finfo(scores.dtype).min)
    out = jnp.einsum("bhgqk,bhkd->bqhgd", jax.nn.softmax(scores, axis=-1), value_cache.astype(q.dtype))
    return out.reshape(1, q_len, c.heads * d) @ layer["wo"], key_cache, value_cache


def step(config: Config, params: dict, input_ids, position, *cache):
    """One call: logits [1, Q, vocab] of the ``input_ids`` fed after ``position`` cached tokens, and
    the cache with their keys and values written at ``position``."""
    x = jnp.take(jnp.asarray(params["embed"]), input_ids, axis=0)
    positions = position + jnp.arange(input_ids.shape[1], dtype=jnp.int32)
    new_cache = []
    for index, layer in enumerate(params["layers"]):
        attended, keys, values = attention(config, layer, rms_norm(x, layer["attention_norm"], config.eps),
                                           positions, position, cache[2 * index], cache[2 * index + 1])
        x = x + attended
        h = rms_norm(x, layer["mlp_norm"], config.eps)
        x = x + (jax.nn.silu(h @ layer["gate"]) * (h @ layer["up"])) @ layer["down"]
        new_cache += [keys, values]
    logits = rms_norm(x, params["norm"], config.eps) @ params["lm_head"]
    return (logits, *new_cache)


def cache_names(config: Config) -> tuple[list[str], list[str]]:
    """The optimum-style names the recipe gives the step's arguments and results (``cache: auto``
    pairs ``past_key_values.N.key`` with ``present.N.key``)."""
    past = [f"past_key_values.{i}.{kind}" for i in range(config.layers) for kind in ("key", "value")]
    present = [f"present.{i}.{kind}" for i in range(config.layers) for kind in ("key", "value")]
    return ["input_ids", "position", *past], ["logits", *present]


def export_step(config: Config = Config(), params: dict | None = None, *, position_shape: tuple = (),
                longest_query: int | None = None):
    """``jax.export`` of the step with the weights closed over (they become the module's constants);
    ``position_shape`` () or (1,). ``longest_query`` None: input_ids [1, 1], one token a call; else
    [1, q], q symbolic with the constraint ``q <= longest_query``, so one export takes every chunk."""
    from jax import export as jax_export

    params = random_params(config) if params is None else params

    def fn(input_ids, position, *cache):
        return step(config, params, input_ids, position.reshape(()), *cache)

    query = 1
    if longest_query is not None:
        (query,) = jax_export.symbolic_shape("q", constraints=[f"q <= {longest_query}"])
    cache = jax.ShapeDtypeStruct((1, config.kv_heads, config.max_context, config.head_dim), jnp.float32)
    specs = [jax.ShapeDtypeStruct((1, query), jnp.int32), jax.ShapeDtypeStruct(position_shape, jnp.int32),
             *[cache] * (2 * config.layers)]
    return jax_export.export(jax.jit(fn))(*specs)


def greedy(config: Config, params: dict, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """Each prompt's greedy tokens from the step function itself, one token per call (the test's own
    truth, independent of the generator validation uses)."""
    fn = jax.jit(partial(step, config, params))
    empty = [jnp.zeros((1, config.kv_heads, config.max_context, config.head_dim), jnp.float32)] * (2 * config.layers)
    results = []
    for prompt in prompts:
        cache, tokens, fed, position = empty, [], list(prompt), 0
        while len(tokens) < new_tokens:
            for token in fed:
                logits, *cache = fn(jnp.array([[token]], jnp.int32), jnp.int32(position), *cache)
                position += 1
            tokens.append(int(jnp.argmax(logits[0, -1])))
            fed = [tokens[-1]]
        results.append(tokens)
    return results
