"""A stateful decoder layer built with coremltools' MIL builder, shaped like a lowered decoder.

The shapes are those of one layer of HuggingFaceTB/SmolLM2-135M (its published config.json:
hidden_size 576, num_attention_heads 9, num_key_value_heads 3, intermediate_size 1536,
rms_norm_eps 1e-5, rope_theta 100000), with random seeded weights. The program has the
artifact's stateful form: ``hidden_states`` [1, Q, 576] with Q a symbol (the query length),
``position`` int32 [1], and the layer's key/value caches as states [1, Hkv, max_context, D].

RMSNorm -> q/k/v linears -> rotary (cos/sin tables gathered at position + arange(Q)) ->
read_state + slice_update + coreml_update_state -> repeat_kv -> SDPA with a causal mask over
the cache -> o_proj + residual -> RMSNorm -> SwiGLU MLP + residual.
"""

from __future__ import annotations

from dataclasses import dataclass

import coremltools as ct
import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import get_new_symbol, types


@dataclass(frozen=True)
class DecoderConfig:
    hidden: int = 576
    heads: int = 9
    kv_heads: int = 3
    intermediate: int = 1536
    rms_eps: float = 1e-5
    rope_theta: float = 100000.0
    max_context: int = 256

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


SMOLLM2_135M = DecoderConfig()


def _weights(config: DecoderConfig, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    d, kv = config.hidden, config.kv_heads * config.head_dim

    def linear(out_features, in_features):
        return (rng.standard_normal((out_features, in_features)) / np.sqrt(in_features)).astype(np.float32)

    return {
        "input_norm": (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32),
        "q_proj": linear(d, d), "k_proj": linear(kv, d), "v_proj": linear(kv, d), "o_proj": linear(d, d),
        "post_norm": (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32),
        "gate_proj": linear(config.intermediate, d), "up_proj": linear(config.intermediate, d),
        "down_proj": linear(d, config.intermediate),
    }


def _rope_tables(config: DecoderConfig) -> tuple[np.ndarray, np.ndarray]:
    inv_freq = 1.0 / config.rope_theta ** (np.arange(0, config.head_dim, 2) / config.head_dim)
    angles = np.outer(np.arange(config.max_context), inv_freq)
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


INT4_BLOCK = 32  # coremltools' per_block int4 default granularity for LLM weights


def quantize_int4_blockwise(weight: np.ndarray, block: int = INT4_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric 4-bit codes and per-block scales ([O, I/block]) of a [O, I] weight."""
    blocks = weight.reshape(weight.shape[0], -1, block)
    scale = np.abs(blocks).max(-1) / 7.0
    codes = np.clip(np.round(blocks / scale[..., None]), -8, 7).reshape(weight.shape)
    return codes.astype(np.int8), scale


def decoder_layer_program(config: DecoderConfig = SMOLLM2_135M, *, dtype=types.fp16, query_length=None,
                          seed: int = 0, int4_weights: bool = False):
    """The layer as a pymil Program; ``query_length=None`` leaves Q symbolic. ``int4_weights``:
    the seven projections as 4-bit per-block weights (``constexpr_blockwise_shift_scale``)."""
    np_dtype = np.float16 if dtype == types.fp16 else np.float32
    w = {k: v.astype(np_dtype) for k, v in _weights(config, seed).items()}
    projections = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    int4 = {name: quantize_int4_blockwise(w[name].astype(np.float32)) for name in projections} if int4_weights else {}
    cos_table, sin_table = (t.astype(np_dtype) for t in _rope_tables(config))
    heads, kv_heads, head_dim, hidden = config.heads, config.kv_heads, config.head_dim, config.hidden
    q_len = get_new_symbol() if query_length is None else query_length
    cache_shape = (1, kv_heads, config.max_context, head_dim)
    specs = [
        mb.TensorSpec(shape=(1, q_len, hidden), dtype=dtype),
        mb.TensorSpec(shape=(1,), dtype=types.int32),
        mb.StateTensorSpec(shape=cache_shape, dtype=dtype),
        mb.StateTensorSpec(shape=cache_shape, dtype=dtype),
    ]
    eps = np_dtype(config.rms_eps)

    def rms_norm(x, weight, name):
        mean_square = mb.reduce_mean(x=mb.mul(x=x, y=x, name=f"{name}_square"), axes=[-1], keep_dims=True,
                                     name=f"{name}_mean")
        inv = mb.rsqrt(x=mb.add(x=mean_square, y=eps, name=f"{name}_eps"), name=f"{name}_rsqrt")
        return mb.mul(x=mb.mul(x=x, y=inv, name=f"{name}_scaled"), y=weight, name=name)

    def split_heads(x, count, name):
        shaped = mb.reshape(x=x, shape=[1, -1, count, head_dim], name=f"{name}_shaped")
        return mb.transpose(x=shaped, perm=[0, 2, 1, 3], name=f"{name}_heads")

    def rotate(x, cos, sin, name):
        half = head_dim // 2
        first = mb.slice_by_index(x=x, begin=[0, 0, 0, 0], end=[0, 0, 0, half],
                                  end_mask=[True, True, True, False], name=f"{name}_first")
        second = mb.slice_by_index(x=x, begin=[0, 0, 0, half], end=[0, 0, 0, head_dim],
                                   end_mask=[True, True, True, True], name=f"{name}_second")
        rotated = mb.concat(values=[mb.mul(x=second, y=np_dtype(-1), name=f"{name}_neg"), first], axis=-1,
                            name=f"{name}_rotated")
        return mb.add(x=mb.mul(x=x, y=cos, name=f"{name}_cos"), y=mb.mul(x=rotated, y=sin, name=f"{name}_sin"),
                      name=name)

    def write_cache(state, update, begin, end, name):
        cache = mb.read_state(input=state, name=f"{name}_read")
        written = mb.slice_update(x=cache, update=update, begin=begin, end=end, name=f"{name}_write")
        mb.coreml_update_state(state=state, value=written, name=f"{name}_update")
        return written

    def repeat_kv(x, name):
        groups = heads // kv_heads
        if groups == 1:
            return x
        expanded = mb.expand_dims(x=x, axes=[2], name=f"{name}_expanded")
        tiled = mb.tile(x=expanded, reps=[1, 1, groups, 1, 1], name=f"{name}_tiled")
        return mb.reshape(x=tiled, shape=[1, heads, config.max_context, head_dim], name=f"{name}_repeated")

    def linear(x, name):
        if name not in int4:
            return mb.linear(x=x, weight=w[name], name=name)
        codes, scale = int4[name]
        weight = mb.constexpr_blockwise_shift_scale(data=codes.astype(types.np_int4_dtype),
                                                    scale=scale.astype(np_dtype), name=f"{name}_weight")
        return mb.linear(x=x, weight=weight, name=name)

    @mb.program(input_specs=specs, opset_version=ct.target.iOS18)
    def prog(hidden_states, position, key_cache, value_cache):
        # int32 position arithmetic: positions = position + arange(Q), begin/end of the cache write
        length = mb.gather(x=mb.shape(x=hidden_states, name="hidden_shape"), indices=1, axis=0, name="query_len")
        steps = mb.range_1d(start=np.int32(0), end=length, step=np.int32(1), name="steps")
        positions = mb.add(x=steps, y=position, name="positions")
        cache_end = mb.add(x=position, y=mb.expand_dims(x=length, axes=[0], name="query_len_1d"), name="cache_end")
        zeros = np.zeros(2, np.int32)
        begin = mb.concat(values=[zeros, position, np.zeros(1, np.int32)], axis=0, name="cache_begin")
        end = mb.concat(values=[np.array([1, kv_heads], np.int32), cache_end, np.array([head_dim], np.int32)],
                        axis=0, name="cache_stop")

        cos = mb.gather(x=cos_table, indices=positions, axis=0, name="rope_cos")  # [Q, D]
        sin = mb.gather(x=sin_table, indices=positions, axis=0, name="rope_sin")
        slots = np.arange(config.max_context, dtype=np.int32).reshape(1, -1)
        visible = mb.less_equal(x=slots, y=mb.expand_dims(x=positions, axes=[-1], name="positions_col"),
                                name="visible")  # [Q, max_context]
        # (visible - 1) * 1e4: 0 where a slot is visible, -1e4 where it is not (select would drop Q)
        visible = mb.cast(x=visible, dtype="fp16" if dtype == types.fp16 else "fp32", name="visible_float")
        mask = mb.mul(x=mb.sub(x=visible, y=np_dtype(1), name="hidden_slots"), y=np_dtype(1e4), name="mask_2d")
        mask = mb.expand_dims(x=mask, axes=[0, 1], name="causal_mask")

        x = rms_norm(hidden_states, w["input_norm"], "input_norm")
        q = rotate(split_heads(linear(x, "q_proj"), heads, "q"), cos, sin, "q_rope")
        k = rotate(split_heads(linear(x, "k_proj"), kv_heads, "k"), cos, sin, "k_rope")
        v = split_heads(linear(x, "v_proj"), kv_heads, "v")
        keys = repeat_kv(write_cache(key_cache, k, begin, end, "key_cache"), "keys")
        values = repeat_kv(write_cache(value_cache, v, begin, end, "value_cache"), "values")
        attn = mb.scaled_dot_product_attention(query=q, key=keys, value=values, attn_mask=mask, name="sdpa")
        merged = mb.reshape(x=mb.transpose(x=attn, perm=[0, 2, 1, 3], name="attn_tokens"), shape=[1, -1, hidden],
                            name="attn_merged")
        h = mb.add(x=hidden_states, y=linear(merged, "o_proj"), name="attn_residual")

        y = rms_norm(h, w["post_norm"], "post_norm")
        gate = mb.silu(x=linear(y, "gate_proj"), name="gate_act")
        up = linear(y, "up_proj")
        down = linear(mb.mul(x=gate, y=up, name="swiglu"), "down_proj")
        return mb.add(x=h, y=down, name="output")

    return prog


def decoder_inputs(config: DecoderConfig, query_length: int, position: int, seed: int = 1) -> dict:
    """Feeds for one step: hidden states, the position, and caches already holding ``position`` tokens."""
    rng = np.random.default_rng(seed)
    cache_shape = (1, config.kv_heads, config.max_context, config.head_dim)
    caches = [rng.standard_normal(cache_shape).astype(np.float32) for _ in range(2)]
    for cache in caches:
        cache[:, :, position:] = 0.0
    return {
        "hidden_states": rng.standard_normal((1, query_length, config.hidden)).astype(np.float32),
        "position": np.array([position], np.int32),
        "key_cache": caches[0],
        "value_cache": caches[1],
    }
