"""More architectures written with Flax, random weights in their published configurations' shapes scaled
down: a ViT, a Llama-style decoder and a U-Net. Each is converted and checked against JAX in fp32, and
built from a recipe at float16 end to end, validated against JAX running the same export."""

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from jax_checks import assert_converts, export, jax, jnp, run_lowered

nn = pytest.importorskip("flax.linen")
RNG = np.random.default_rng(0)


def bound(module, *example):
    variables = module.init(jax.random.key(0), *[jnp.asarray(e) for e in example])
    return lambda *args: module.apply(variables, *args)


def cosine(got, want):
    got, want = np.ravel(got).astype(np.float64), np.ravel(want).astype(np.float64)
    return float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want)))


# --- ViT ---------------------------------------------------------------------------------------------

class ViTBlock(nn.Module):
    """A pre-norm encoder block: self-attention and a GELU MLP, each behind a LayerNorm and a residual."""

    heads: int
    width: int

    @nn.compact
    def __call__(self, x):
        normed = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=self.heads)(normed, normed)
        mlp = nn.Dense(self.width)(nn.gelu(nn.Dense(self.width * 4)(nn.LayerNorm()(x))))
        return x + mlp


class ViT(nn.Module):
    """ViT-B/16's layout (patch conv, class token, learned positions, pre-norm blocks, head), narrower."""

    patch: int = 8
    width: int = 32
    heads: int = 4
    depth: int = 2
    classes: int = 10

    @nn.compact
    def __call__(self, image):
        x = nn.Conv(self.width, (self.patch, self.patch), strides=(self.patch, self.patch), padding="VALID")(image)
        x = x.reshape(x.shape[0], -1, self.width)
        token = self.param("class_token", nn.initializers.normal(0.02), (1, 1, self.width))
        x = jnp.concatenate([jnp.broadcast_to(token, (x.shape[0], 1, self.width)), x], axis=1)
        x = x + self.param("positions", nn.initializers.normal(0.02), (1, x.shape[1], self.width))
        for _ in range(self.depth):
            x = ViTBlock(self.heads, self.width)(x)
        return nn.Dense(self.classes)(nn.LayerNorm()(x)[:, 0])


# --- Llama-style decoder -----------------------------------------------------------------------------

class RMSNorm(nn.Module):
    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],))
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def rotary(x, base=10000.0):
    """Rotary position embedding of (batch, length, heads, head_dim), positions from an iota."""
    length, half = x.shape[1], x.shape[-1] // 2
    positions = jax.lax.iota(jnp.float32, length)[:, None]
    frequencies = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = (positions * frequencies)[None, :, None, :]
    sin, cos = jnp.sin(angles), jnp.cos(angles)
    first, second = x[..., :half], x[..., half:]
    return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


class GroupedQueryAttention(nn.Module):
    heads: int
    kv_heads: int
    head_dim: int

    @nn.compact
    def __call__(self, x):
        batch, length, _ = x.shape
        q = nn.Dense(self.heads * self.head_dim, use_bias=False)(x).reshape(batch, length, self.heads, self.head_dim)
        k = nn.Dense(self.kv_heads * self.head_dim, use_bias=False)(x).reshape(batch, length, self.kv_heads, -1)
        v = nn.Dense(self.kv_heads * self.head_dim, use_bias=False)(x).reshape(batch, length, self.kv_heads, -1)
        q, k = rotary(q), rotary(k)
        repeat = self.heads // self.kv_heads
        k, v = jnp.repeat(k, repeat, axis=2), jnp.repeat(v, repeat, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(self.head_dim)
        # tril of a float mask: a boolean select converts to a boolean Where, which onnxruntime lacks
        causal = jnp.tril(jnp.ones((length, length), scores.dtype)) > 0
        scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
        out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
        return nn.Dense(x.shape[-1], use_bias=False)(out.reshape(batch, length, -1))


class SwiGLU(nn.Module):
    hidden: int

    @nn.compact
    def __call__(self, x):
        gate = nn.Dense(self.hidden, use_bias=False)(x)
        up = nn.Dense(self.hidden, use_bias=False)(x)
        return nn.Dense(x.shape[-1], use_bias=False)(nn.silu(gate) * up)


class Llama(nn.Module):
    """Llama's decoder (RMSNorm, rotary, grouped-query attention, SwiGLU) at toy widths."""

    vocab: int = 64
    width: int = 32
    heads: int = 4
    kv_heads: int = 2
    depth: int = 2
    tied: bool = False

    @nn.compact
    def __call__(self, ids):
        embed = nn.Embed(self.vocab, self.width)
        x = embed(ids)
        for _ in range(self.depth):
            x = x + GroupedQueryAttention(self.heads, self.kv_heads, self.width // self.heads)(RMSNorm()(x))
            x = x + SwiGLU(self.width * 2)(RMSNorm()(x))
        x = RMSNorm()(x)
        return embed.attend(x) if self.tied else nn.Dense(self.vocab, use_bias=False)(x)


# --- U-Net -------------------------------------------------------------------------------------------

class ConvBlock(nn.Module):
    features: int
    norm: str

    @nn.compact
    def __call__(self, x):
        for _ in range(2):
            x = nn.Conv(self.features, (3, 3))(x)
            x = nn.GroupNorm(num_groups=4)(x) if self.norm == "group" else nn.BatchNorm(use_running_average=True)(x)
            x = nn.relu(x)
        return x


class UNet(nn.Module):
    """The U-Net's contracting path (convs, max pool), expanding path (stride-2 transposed convs) and
    skip concatenations, two levels deep."""

    widths: tuple = (8, 16)
    norm: str = "group"
    classes: int = 2

    @nn.compact
    def __call__(self, x):
        skips = []
        for features in self.widths:
            x = ConvBlock(features, self.norm)(x)
            skips.append(x)
            x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = ConvBlock(self.widths[-1] * 2, self.norm)(x)
        for features, skip in zip(reversed(self.widths), reversed(skips)):
            x = nn.ConvTranspose(features, (2, 2), strides=(2, 2))(x)
            x = ConvBlock(features, self.norm)(jnp.concatenate([x, skip], axis=-1))
        return nn.Conv(self.classes, (1, 1))(x)


# --- fp32: onnxruntime and the Core ML lowering against JAX -----------------------------------------

def check_fp32(fn, *arrays, tol=(2e-3, 2e-3)):
    model = assert_converts(fn, *arrays, rtol=1e-4, atol=1e-4, lowered_tol=tol)
    want = np.asarray(fn(*arrays))
    got = run_lowered(model, list(arrays))[0]
    value = cosine(got, want)
    print(f"fp32 cosine against JAX: {value:.9f}")
    assert value > 0.99999
    return value


@pytest.mark.parametrize("shape", [(1, 32, 32, 3), (2, 16, 24, 1)], ids=["square-rgb", "wide-gray-batch2"])
def test_vit(shape):
    image = RNG.standard_normal(shape).astype(np.float32)
    check_fp32(bound(ViT(), image), image)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("kv_heads", [1, 2], ids=["multi-query", "grouped"])
@pytest.mark.parametrize("length", [5, 8])
def test_llama_decoder(tied, kv_heads, length):
    ids = RNG.integers(0, 64, (2, length)).astype(np.int32)
    check_fp32(bound(Llama(kv_heads=kv_heads, tied=tied), ids), ids)


@pytest.mark.parametrize("norm", ["group", "batch"])
@pytest.mark.parametrize("shape", [(1, 16, 16, 3), (2, 8, 12, 1)], ids=["square", "wide-batch2"])
def test_unet(norm, shape):
    image = RNG.standard_normal(shape).astype(np.float32)
    check_fp32(bound(UNet(norm=norm), image), image)


# --- fp16 recipe builds ------------------------------------------------------------------------------

NORMAL = "{distribution: normal}"


def build_fp16(tmp_path: Path, name: str, fn, example, sample: str) -> float:
    """``fn`` exported and built from a float16 recipe, its input drawn as ``sample`` (a RandomInput);
    returns the minimum cosine over the samples."""
    from rich.console import Console

    from edgebuild.build.run import run_recipes

    source = tmp_path / f"{name}.jaxexport"
    source.write_bytes(bytes(export(fn, example).serialize()))
    recipe = tmp_path / f"{name}.yaml"
    recipe.write_text(f"""edgebuild: 1
name: {name}
source: {{model: {source.name}}}
target: {{backend: coreml, precision: float16}}
validate:
  samples: 3
  inputs: {{input_0: {{random: {sample}}}}}
  thresholds: {{cosine_min: 0.999}}
outputs: {{dir: build}}
""")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run_recipes([str(recipe)], cache_dir=str(tmp_path / "cache"), as_json=True,
                           console=Console(file=io.StringIO()))
    (variant,) = json.loads(out.getvalue())["variants"]
    assert code == 0, json.dumps(variant)[:3000]
    assert variant["status"] == "built"
    report = json.loads((tmp_path / "build" / "default" / "report.json").read_text())
    validation = report["validation"]
    assert validation["failures"] == []
    metrics = validation["runtimes"]["interpreter"]["metrics"]
    worst = min(output["cosine"]["min"] for output in metrics.values())
    print(f"{name} fp16 cosine against JAX: {worst:.9f}")
    assert worst >= 0.999
    return worst


@pytest.mark.slow
def test_vit_builds_at_float16(tmp_path):
    image = RNG.standard_normal((1, 32, 32, 3)).astype(np.float32)
    build_fp16(tmp_path, "vit", bound(ViT(), image), image, NORMAL)


def test_llama_builds_at_float16(tmp_path):
    ids = RNG.integers(0, 64, (1, 8)).astype(np.int32)
    build_fp16(tmp_path, "llama", bound(Llama(), ids), ids, "{low: 0, high: 64}")


@pytest.mark.slow
def test_unet_builds_at_float16(tmp_path):
    image = RNG.standard_normal((1, 16, 16, 3)).astype(np.float32)
    build_fp16(tmp_path, "unet", bound(UNet(), image), image, NORMAL)
