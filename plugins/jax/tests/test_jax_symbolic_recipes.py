"""Recipes whose inputs have a range or an enumeration, built end to end with symbolic dims kept:
JAX functions (a BERT-style encoder over a symbolic sequence, a GRU written with nn.scan over a
symbolic batch, a CNN over symbolic image sizes) and a shape-polymorphic jax.export. The Core ML
package keeps the range or enumeration, and validation runs it against JAX at several sizes."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from jax_checks import export, jax, jnp

pytest.importorskip("flax")

MODELS = '''
import jax, jax.numpy as jnp
import flax.linen as nn


class EncoderLayer(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.LayerNorm()(x + nn.MultiHeadDotProductAttention(num_heads=4)(x, x))
        return nn.LayerNorm()(x + nn.Dense(32)(nn.gelu(nn.Dense(64)(x))))


class Encoder(nn.Module):
    """BERT-style: token embeddings plus the first positions of a learned table, two layers."""

    @nn.compact
    def __call__(self, ids):
        position = self.param("position", nn.initializers.normal(0.02), (32, 32))
        x = nn.Embed(50, 32)(ids) + position[: ids.shape[1]]
        for _ in range(2):
            x = EncoderLayer()(x)
        return x


class GRUClassifier(nn.Module):
    @nn.compact
    def __call__(self, x):
        cell = nn.scan(nn.GRUCell, variable_broadcast="params", split_rngs={"params": False},
                       in_axes=1, out_axes=1)(features=16)
        _, outputs = cell(jnp.zeros((x.shape[0], 16), x.dtype), x)
        return nn.Dense(3)(outputs[:, -1])


class CNN(nn.Module):
    """Strided SAME convolutions (padding known only at run time), average pooling, a residual
    block and global pooling."""

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(8, (3, 3), strides=(2, 2))(x))
        x = nn.avg_pool(x, (2, 2), strides=(2, 2))
        y = nn.relu(nn.Conv(8, (3, 3))(x))
        x = nn.relu(x + nn.Conv(8, (3, 3), padding="VALID")(jnp.pad(y, ((0, 0), (1, 1), (1, 1), (0, 0)))))
        return nn.Dense(4)(jnp.mean(x, axis=(1, 2)))


EXAMPLES = {"encoder": (Encoder, jnp.zeros((1, 8), jnp.int32)), "gru": (GRUClassifier, jnp.zeros((2, 6, 5))),
            "cnn": (CNN, jnp.zeros((1, 16, 16, 3)))}


def make(kind):
    module, example = EXAMPLES[kind]
    model = module()
    return model.apply, model.init(jax.random.key(0), example)
'''


def run(recipe: Path, cache: Path) -> tuple[int, dict]:
    from edgebuild.build.run import run_recipes

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run_recipes([str(recipe)], cache_dir=str(cache), as_json=True, console=Console(file=io.StringIO()))
    return code, json.loads(out.getvalue())


def build(folder: Path, name: str, source: str, validate_inputs: str = "") -> dict:
    """Build the recipe at float32 and return its report's validation record (asserted passed)."""
    recipe = folder / f"{name}.yaml"
    recipe.write_text(f"edgebuild: 1\nname: {name}\nsource:\n{source}" + f"""\
target: {{backend: coreml, precision: float32}}
validate:
  samples: 1
{validate_inputs}  thresholds: {{cosine_min: 0.9999}}
outputs: {{dir: build}}
""")
    code, result = run(recipe, folder / "cache")
    (variant,) = result["variants"]
    assert code == 0 and variant["status"] == "built", json.dumps(variant)[:2000]
    validation = json.loads((folder / "build" / "default" / "report.json").read_text())["validation"]
    assert validation["reference"] == "stablehlo (eager)" and validation["failures"] == []
    return validation


def validated_shapes(validation: dict, name: str) -> list[list[int]]:
    return [entry["inputs"][name] for entry in validation["shapes"]]


def package_input(folder: Path, name: str):
    """The package's description of input ``name`` (its shape ranges or enumerated shapes)."""
    import coremltools as ct

    spec = ct.utils.load_spec(str(folder / "build" / "default" / "model.mlpackage"))
    (found,) = [i for i in spec.description.input if i.name == name]
    return found.type.multiArrayType


def function_source(folder: Path, monkeypatch, kind: str, name: str, shape: str, dtype: str) -> str:
    from flax import serialization

    (folder / "jax_symbolic_models.py").write_text(MODELS)
    monkeypatch.syspath_prepend(str(folder))
    import importlib

    models = importlib.import_module("jax_symbolic_models")
    _, params = models.make(kind)
    (folder / f"{kind}.msgpack").write_bytes(serialization.to_bytes(params))
    return f"""  model: {kind}.msgpack
  format: stablehlo
  inputs: {{{name}: {{shape: {shape}, dtype: {dtype}}}}}
  options: {{factory: "jax_symbolic_models:make", factory_kwargs: {{kind: {kind}}}}}
"""


@pytest.mark.slow
def test_a_bert_style_encoder_over_a_range_of_sequence_lengths(tmp_path, monkeypatch):
    source = function_source(tmp_path, monkeypatch, "encoder", "ids", "[1, {range: [1, 32]}]", "int32")
    validation = build(tmp_path, "encoder", source, "  inputs: {ids: {random: {low: 0, high: 50, seed: 0}}}\n")
    shapes = validated_shapes(validation, "ids")
    assert [1, 1] in shapes and [1, 32] in shapes and len(shapes) >= 2  # both bounds (and one inside)
    ranges = package_input(tmp_path, "ids").shapeRange.sizeRanges
    assert [(r.lowerBound, r.upperBound) for r in ranges] == [(1, 1), (1, 32)]
    import onnx

    imported = onnx.load(str(next((tmp_path / "cache").rglob("model.onnx"))), load_external_data=False)
    (ids,) = imported.graph.input
    assert ids.type.tensor_type.shape.dim[1].dim_param  # one graph for every length


@pytest.mark.slow
def test_a_gru_written_with_scan_over_a_range_of_batch_sizes(tmp_path, monkeypatch):
    source = function_source(tmp_path, monkeypatch, "gru", "x", "[{range: [1, 4]}, 6, 5]", "float32")
    validation = build(tmp_path, "gru", source)
    batches = sorted(s[0] for s in validated_shapes(validation, "x"))
    assert batches[0] == 1 and batches[-1] == 4  # the seeded size inside may meet a bound
    ranges = package_input(tmp_path, "x").shapeRange.sizeRanges
    assert (ranges[0].lowerBound, ranges[0].upperBound) == (1, 4)


@pytest.mark.slow
def test_a_cnn_over_enumerated_image_sizes(tmp_path, monkeypatch):
    """Height and width enumerated apart: validated in every combination, non-square ones too."""
    source = function_source(tmp_path, monkeypatch, "cnn", "image", "[1, {enumerated: [16, 24]}, "
                             "{enumerated: [16, 20]}, 3]", "float32")
    validation = build(tmp_path, "cnn", source)
    assert sorted(validated_shapes(validation, "image")) == [[1, 16, 16, 3], [1, 16, 20, 3], [1, 24, 16, 3],
                                                             [1, 24, 20, 3]]
    enumerated = package_input(tmp_path, "image").enumeratedShapes.shapes
    assert sorted(list(s.shape) for s in enumerated) == sorted(validated_shapes(validation, "image"))


@pytest.mark.slow
def test_a_cnn_over_ranges_of_image_sizes(tmp_path, monkeypatch):
    """Height and width in ranges: strided SAME convolutions pad at run time inside the package."""
    source = function_source(tmp_path, monkeypatch, "cnn", "image", "[1, {range: [16, 40]}, {range: [12, 30]}, 3]",
                             "float32")
    validation = build(tmp_path, "cnn", source)
    shapes = validated_shapes(validation, "image")
    assert [1, 16, 12, 3] in shapes and [1, 40, 30, 3] in shapes
    ranges = package_input(tmp_path, "image").shapeRange.sizeRanges
    assert [(r.lowerBound, r.upperBound) for r in ranges] == [(1, 1), (16, 40), (12, 30), (3, 3)]


W = np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32) * 0.3


def attention_pool(x):
    """Self-attention over a symbolic sequence, pooled: ``weights @ V`` contracts that dim."""
    q, k, v = x @ W, x @ W[:, ::-1], jnp.tanh(x @ W)
    weights = jax.nn.softmax(jnp.einsum("bqd,bkd->bqk", q, k) / np.sqrt(8.0), axis=-1)
    return jnp.mean(jnp.einsum("bqk,bkd->bqd", weights, v), axis=1)


def test_a_shape_polymorphic_export_with_an_enumerated_sequence(tmp_path):
    from jax import export as jax_export

    batch, sequence = jax_export.symbolic_shape("b, s")
    exported = export(attention_pool, jax.ShapeDtypeStruct((batch, sequence, 16), np.float32))
    (tmp_path / "pool.jaxexport").write_bytes(bytes(exported.serialize()))
    validation = build(tmp_path, "pool", """  model: pool.jaxexport
  inputs: {x: {shape: [{enumerated: [1, 2]}, {enumerated: [3, 12]}, 16], dtype: float32}}
""")
    combinations = [[1, 3, 16], [1, 12, 16], [2, 3, 16], [2, 12, 16]]
    assert sorted(validated_shapes(validation, "x")) == combinations
    enumerated = package_input(tmp_path, "x").enumeratedShapes.shapes
    assert sorted(list(s.shape) for s in enumerated) == combinations


def test_a_shape_polymorphic_export_with_whole_enumerated_shapes(tmp_path):
    from jax import export as jax_export

    batch, sequence = jax_export.symbolic_shape("b, s")
    exported = export(attention_pool, jax.ShapeDtypeStruct((batch, sequence, 16), np.float32))
    (tmp_path / "pool.jaxexport").write_bytes(bytes(exported.serialize()))
    shapes = [[1, 3, 16], [2, 7, 16], [1, 12, 16]]
    validation = build(tmp_path, "pool", f"""  model: pool.jaxexport
  inputs: {{x: {{shape: {{enumerated: {shapes}}}, dtype: float32}}}}
""")
    assert validated_shapes(validation, "x") == shapes
    assert [list(s.shape) for s in package_input(tmp_path, "x").enumeratedShapes.shapes] == shapes


def test_a_range_and_a_fixed_input_of_a_function_share_nothing_they_should_not(tmp_path, monkeypatch):
    """Dims spelled alike in two inputs are one symbol: the export sees they agree."""
    from edgebuild_jax.symbolic_dims import export_specs

    names, specs = export_specs({
        "ids": {"shape": [1, {"range": [1, 32]}], "dtype": "int32"},
        "mask": {"shape": [1, {"range": [1, 32]}], "dtype": "float32"},
        "image": {"shape": [{"enumerated": [2, 4]}, {"enumerated": [2, 4]}], "dtype": "float32"},
    })
    assert names == ["ids", "mask", "image"]
    assert specs[0].shape[1] == specs[1].shape[1]  # one sequence length
    assert specs[2].shape[0] != specs[2].shape[1]  # enumerations of one input: every combination
    assert specs[0].shape[0] == 1 and specs[1].dtype == np.float32
    exported = export(lambda ids, mask, image: ids * mask, *specs)  # shapes provably equal
    assert len(exported.in_avals) == 3


@pytest.mark.parametrize("shape,message", [
    ([1, "seq-len"], "a dim name is an identifier"),
    ([1, {"default": 3}], "is not a size, a name"),
])
def test_a_dim_a_function_cannot_be_exported_for_is_named(shape, message):
    from edgebuild.plugin import UsageError
    from edgebuild_jax.symbolic_dims import export_specs

    with pytest.raises(UsageError, match=message):
        export_specs({"x": {"shape": shape, "dtype": "float32"}})


# --- docs/stablehlo.md, "Symbolic dimensions": the export and its recipe run as written ---------

def docs_blocks(language: str) -> list[str]:
    text = (Path(__file__).resolve().parents[3] / "docs" / "stablehlo.md").read_text()
    start = text.index("## Symbolic dimensions")
    section = text[start:text.find("\n## ", start + 5)]
    return [block.split("\n", 1)[1] for block in section.split("```")[1::2] if block.startswith(language)]


def test_the_docs_symbolic_export_builds_for_its_range(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    python = docs_blocks("python")[0]
    exec(compile(python, "stablehlo.md", "exec"), {})
    recipe = tmp_path / "encoder.yaml"
    recipe.write_text(docs_blocks("yaml")[0] + "outputs: {dir: build}\n")
    code, result = run(recipe, tmp_path / "cache")
    (variant,) = result["variants"]
    assert code == 0 and variant["status"] == "built", json.dumps(variant)[:2000]
    validation = json.loads((tmp_path / "build" / "default" / "report.json").read_text())["validation"]
    shapes = validated_shapes(validation, "x")
    assert [1, 1, 16] in shapes and [1, 128, 16] in shapes and validation["failures"] == []
