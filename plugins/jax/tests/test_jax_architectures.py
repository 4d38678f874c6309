"""Common architectures written with Flax (random weights from their usual configurations),
exported with jax.export, converted and run through the Core ML lowering against JAX."""

import numpy as np
import pytest

from jax_checks import assert_converts, jax, jnp

nn = pytest.importorskip("flax.linen")
RNG = np.random.default_rng(0)


def bound(module, *example):
    variables = module.init(jax.random.key(0), *[jnp.asarray(e) for e in example])
    return lambda *args: module.apply(variables, *args)


class ResidualCNN(nn.Module):
    """A ResNet-style stem and two residual blocks with batch norm, then global pooling."""

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.BatchNorm(use_running_average=True)(nn.Conv(16, (3, 3), strides=(2, 2))(x)))
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
        for features in (16, 32):
            shortcut = x if x.shape[-1] == features else nn.Conv(features, (1, 1))(x)
            y = nn.relu(nn.BatchNorm(use_running_average=True)(nn.Conv(features, (3, 3))(x)))
            y = nn.BatchNorm(use_running_average=True)(nn.Conv(features, (3, 3))(y))
            x = nn.relu(y + shortcut)
        return nn.Dense(10)(jnp.mean(x, axis=(1, 2)))


class EncoderLayer(nn.Module):
    """A BERT-style post-norm encoder layer: multi-head self-attention and a GELU MLP."""

    heads: int = 4
    width: int = 32

    @nn.compact
    def __call__(self, x):
        attended = nn.MultiHeadDotProductAttention(num_heads=self.heads)(x, x)
        x = nn.LayerNorm()(x + attended)
        mlp = nn.Dense(self.width)(nn.gelu(nn.Dense(self.width * 4)(x)))
        return nn.LayerNorm()(x + mlp)


class Encoder(nn.Module):
    vocab: int = 50

    @nn.compact
    def __call__(self, ids):
        x = nn.Embed(self.vocab, 32)(ids) + self.param("position", nn.initializers.normal(0.02), (8, 32))
        for _ in range(2):
            x = EncoderLayer()(x)
        return x


class GRUClassifier(nn.Module):
    """A GRU over the sequence written with nn.scan (lax.scan underneath)."""

    @nn.compact
    def __call__(self, x):
        cell = nn.scan(nn.GRUCell, variable_broadcast="params", split_rngs={"params": False},
                       in_axes=1, out_axes=1)(features=16)
        carry = jnp.zeros((x.shape[0], 16), x.dtype)
        _, outputs = cell(carry, x)
        return nn.Dense(3)(outputs[:, -1])


def test_residual_cnn_with_batch_norm():
    image = RNG.standard_normal((1, 32, 32, 3)).astype(np.float32)
    assert_converts(bound(ResidualCNN(), image), image, rtol=1e-4, atol=1e-4, lowered_tol=(2e-3, 2e-3))


def test_bert_style_encoder():
    ids = RNG.integers(0, 50, (2, 8)).astype(np.int32)
    assert_converts(bound(Encoder(), ids), ids, rtol=1e-4, atol=1e-4, lowered_tol=(2e-3, 2e-3))


def test_gru_written_with_scan():
    sequence = RNG.standard_normal((2, 6, 5)).astype(np.float32)
    assert_converts(bound(GRUClassifier(), sequence), sequence, rtol=1e-4, atol=1e-4, lowered_tol=(2e-3, 2e-3))
