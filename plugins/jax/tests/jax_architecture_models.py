"""Architectures in their published configurations' layouts, scaled down, with seeded random weights:
each ``make_*`` returns ``(fn, example inputs, input names, how validation draws each input)``.

- ResNet-18 (He et al. 2015; torchvision's ``resnet18``): a 7x7 stride-2 stem, a 3x3 stride-2 max
  pool, basic blocks (two 3x3 convs with batch norm and a residual, a 1x1 stride-2 projection where
  the width changes) in four stages, global average pooling and a classifier. Scaled: widths
  64-128-256-512 to 8-16-32-64, one block per stage instead of two, 32x32 images, 10 classes.
  The batch-norm statistics are random too, so no norm is the identity.
- BERT-base (Devlin et al. 2018; ``bert-base-uncased``'s config.json): word, position and token-type
  embeddings with LayerNorm (eps 1e-12), post-norm encoder layers (self-attention, GELU MLP of 4x the
  width), the tanh pooler over the first token. Scaled: hidden 768 to 64, 12 layers to 2, 12 heads to
  4, intermediate 3072 to 256, vocab 30522 to 128, 16 positions.
- A GRU classifier (Cho et al. 2014) over a feature sequence with Flax's ``nn.scan`` of ``GRUCell``,
  as Flax's sequence examples write it: hidden 32, 12 steps, 3 classes.
- An LSTM language model (Zaremba et al. 2014, "medium": 2 layers of 650 units over 35 steps, as in
  PyTorch's word_language_model) written with plain ``jax.lax.scan`` over its time steps: 2 layers of
  32 units over 12 steps, a 96-token vocabulary, logits for every step.
"""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp

nn = pytest.importorskip("flax.linen")

NORMAL = "{distribution: normal}"


def bound(module, *example, randomise_stats=False, seed=0):
    """``module.apply`` with its variables from ``init``; batch-norm statistics drawn at random."""
    variables = module.init(jax.random.key(seed), *[jnp.asarray(e) for e in example])
    if randomise_stats and "batch_stats" in variables:
        rng = np.random.default_rng(seed)
        stats = jax.tree_util.tree_map_with_path(
            lambda path, a: (rng.uniform(0.5, 2.0, a.shape) if "var" in jax.tree_util.keystr(path)
                             else rng.normal(0.0, 0.2, a.shape)).astype(np.float32), variables["batch_stats"])
        variables = {**variables, "batch_stats": stats}
    return lambda *args: module.apply(variables, *args)


# --- ResNet-18 ---------------------------------------------------------------------------------------

class BasicBlock(nn.Module):
    features: int
    stride: int

    @nn.compact
    def __call__(self, x):
        norm = lambda: nn.BatchNorm(use_running_average=True)  # noqa: E731  (inference: running stats)
        y = nn.relu(norm()(nn.Conv(self.features, (3, 3), strides=self.stride, use_bias=False)(x)))
        y = norm()(nn.Conv(self.features, (3, 3), use_bias=False)(y))
        if x.shape[-1] != self.features or self.stride != 1:
            x = norm()(nn.Conv(self.features, (1, 1), strides=self.stride, use_bias=False)(x))
        return nn.relu(y + x)


class ResNet(nn.Module):
    widths: tuple = (8, 16, 32, 64)
    blocks: int = 1
    classes: int = 10

    @nn.compact
    def __call__(self, image):
        x = nn.Conv(self.widths[0], (7, 7), strides=2, padding=3, use_bias=False)(image)
        x = nn.relu(nn.BatchNorm(use_running_average=True)(x))
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        for stage, features in enumerate(self.widths):
            for block in range(self.blocks):
                x = BasicBlock(features, 2 if stage > 0 and block == 0 else 1)(x)
        return nn.Dense(self.classes)(jnp.mean(x, axis=(1, 2)))


def make_resnet(rng):
    image = rng.standard_normal((1, 32, 32, 3)).astype(np.float32)
    return bound(ResNet(), image, randomise_stats=True), [image], ["image"], [NORMAL]


# --- BERT-base ---------------------------------------------------------------------------------------

class BertLayer(nn.Module):
    heads: int
    intermediate: int

    @nn.compact
    def __call__(self, x, mask):
        attended = nn.MultiHeadDotProductAttention(num_heads=self.heads)(x, x, mask=mask)
        x = nn.LayerNorm(epsilon=1e-12)(x + attended)
        mlp = nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(self.intermediate)(x), approximate=False))
        return nn.LayerNorm(epsilon=1e-12)(x + mlp)


class Bert(nn.Module):
    vocab: int = 128
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    intermediate: int = 256
    positions: int = 16

    @nn.compact
    def __call__(self, input_ids, attention_mask):
        length = input_ids.shape[1]
        x = nn.Embed(self.vocab, self.hidden)(input_ids)
        x = x + nn.Embed(self.positions, self.hidden)(jnp.arange(length))[None]
        x = x + nn.Embed(2, self.hidden)(jnp.zeros_like(input_ids))  # one segment: token type 0
        x = nn.LayerNorm(epsilon=1e-12)(x)
        mask = nn.make_attention_mask(jnp.ones_like(attention_mask), attention_mask > 0)
        for _ in range(self.layers):
            x = BertLayer(self.heads, self.intermediate)(x, mask)
        pooled = jnp.tanh(nn.Dense(self.hidden)(x[:, 0]))
        return x, pooled


def make_bert(rng):
    ids = rng.integers(0, 128, (1, 16)).astype(np.int32)
    mask = np.ones((1, 16), np.int32)  # validation draws padding masks of 0s and 1s
    return (bound(Bert(), ids, mask), [ids, mask], ["input_ids", "attention_mask"],
            ["{low: 0, high: 128}", "{low: 0, high: 2}"])


# --- GRU (nn.scan) -----------------------------------------------------------------------------------

class GRUClassifier(nn.Module):
    hidden: int = 32
    classes: int = 3

    @nn.compact
    def __call__(self, x):
        cell = nn.scan(nn.GRUCell, variable_broadcast="params", split_rngs={"params": False},
                       in_axes=1, out_axes=1)(features=self.hidden)
        _, outputs = cell(jnp.zeros((x.shape[0], self.hidden), x.dtype), x)
        return nn.Dense(self.classes)(outputs[:, -1])


def make_gru(rng):
    sequence = rng.standard_normal((1, 12, 8)).astype(np.float32)
    return bound(GRUClassifier(), sequence), [sequence], ["features"], [NORMAL]


# --- LSTM language model (plain lax.scan) ------------------------------------------------------------

def lstm_params(rng, vocab=96, hidden=32, layers=2):
    scale = 1.0 / np.sqrt(hidden)
    uniform = lambda *shape: rng.uniform(-scale, scale, shape).astype(np.float32)  # noqa: E731  (as torch inits)
    return {"embed": rng.standard_normal((vocab, hidden)).astype(np.float32) * 0.5,
            "layers": [{"input": uniform(hidden, 4 * hidden), "recurrent": uniform(hidden, 4 * hidden),
                        "bias": uniform(4 * hidden)} for _ in range(layers)],
            "decoder": uniform(hidden, vocab), "decoder_bias": uniform(vocab)}


def lstm_layer(layer, xs):
    """One LSTM layer over xs [steps, batch, width] with lax.scan: the gates in PyTorch's order
    (input, forget, cell, output), the carry (h, c) starting at zero."""
    hidden = layer["recurrent"].shape[0]

    def cell(carry, x):
        h, c = carry
        gates = x @ layer["input"] + h @ layer["recurrent"] + layer["bias"]
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    zeros = jnp.zeros((xs.shape[1], hidden), xs.dtype)
    _, hs = jax.lax.scan(cell, (zeros, zeros), xs)
    return hs


def lstm_language_model(params, input_ids):
    xs = jnp.take(params["embed"], input_ids, axis=0).transpose(1, 0, 2)  # [steps, batch, width]
    for layer in params["layers"]:
        xs = lstm_layer(layer, xs)
    return (xs.transpose(1, 0, 2) @ params["decoder"]) + params["decoder_bias"]


def make_lstm(rng):
    params = lstm_params(np.random.default_rng(1))
    ids = rng.integers(0, 96, (1, 12)).astype(np.int32)
    return (lambda input_ids: lstm_language_model(params, input_ids)), [ids], ["input_ids"], ["{low: 0, high: 96}"]


ARCHITECTURES = {"resnet18": make_resnet, "bert_base": make_bert, "gru": make_gru, "lstm_scan": make_lstm}
