"""A JAX model built end to end from a recipe: exported by jax.export (serialized, as MLIR text and as
bytecode), imported, lowered to Core ML and validated against JAX running the same module."""

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from jax_checks import export, jax, jnp

RNG = np.random.default_rng(0)
W1 = RNG.standard_normal((16, 32)).astype(np.float32) * 0.3
W2 = RNG.standard_normal((32, 4)).astype(np.float32) * 0.3


def mlp(x, scale):
    hidden = jax.nn.gelu(x @ W1) * scale
    return jax.nn.softmax(hidden @ W2, axis=-1), jnp.tanh(hidden)


def run(recipe: Path, cache: Path) -> tuple[int, dict]:
    from edgebuild.build.run import run_recipes

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run_recipes([str(recipe)], cache_dir=str(cache), as_json=True, console=Console(file=io.StringIO()))
    return code, json.loads(out.getvalue())


def build_validated(folder: Path, name: str, source: str) -> dict:
    """Build the recipe whose ``source:`` section is ``source`` (YAML lines) at float32, validated
    against JAX; the interpreter's metrics by output."""
    recipe = folder / f"{name}.yaml"
    recipe.write_text(f"edgebuild: 1\nname: {name}\nsource:\n{source}" + """target: {backend: coreml, precision: float32}
validate:
  samples: 3
  thresholds: {cosine_min: 0.9999}
outputs: {dir: build}
""")
    code, result = run(recipe, folder / "cache")
    (variant,) = result["variants"]
    assert code == 0 and variant["status"] == "built", variant
    validation = json.loads((folder / "build" / "default" / "report.json").read_text())["validation"]
    assert validation["reference"] == "stablehlo (eager)" and validation["failures"] == []
    metrics = validation["runtimes"]["interpreter"]["metrics"]
    assert all(output["cosine"]["min"] >= 0.9999 for output in metrics.values())
    return metrics


def write_source(folder: Path, form: str) -> Path:
    exported = export(mlp, np.zeros((2, 16), np.float32), np.zeros((), np.float32))
    if form == "jaxexport":
        path = folder / "mlp.jaxexport"
        path.write_bytes(bytes(exported.serialize()))
    elif form == "mlir":
        path = folder / "mlp.mlir"
        path.write_text(exported.mlir_module())
    else:
        path = folder / "mlp.mlirbc"
        path.write_bytes(bytes(exported.mlir_module_serialized))
    return path


@pytest.mark.parametrize("form", ["jaxexport", "mlir", "mlirbc"])
def test_a_jax_export_builds_and_validates_against_jax(tmp_path, form):
    source = write_source(tmp_path, form)
    metrics = build_validated(tmp_path, "mlp", f"""  model: {source.name}
  inputs: {{scale: {{value: 1.5}}}}
  options: {{output_names: [probabilities, features]}}
""")
    assert set(metrics) == {"probabilities", "features"}
    assert all(output["max_abs"]["max"] < 1e-4 for output in metrics.values())


def test_an_unsupported_op_is_refused_with_its_python_line(tmp_path):
    exported = export(lambda x: jax.lax.population_count(x), np.zeros(3, np.int32))
    path = tmp_path / "pop.jaxexport"
    path.write_bytes(bytes(exported.serialize()))
    recipe = tmp_path / "pop.yaml"
    recipe.write_text(f"""edgebuild: 1
name: pop
source: {{model: {path.name}}}
target: {{backend: coreml}}
outputs: {{dir: build}}
""")
    code, result = run(recipe, tmp_path / "cache")
    assert code == 1
    text = json.dumps(result)
    assert "stablehlo.popcnt" in text and "test_jax_recipes.py:" in text
    assert not (tmp_path / "build" / "default" / "model.mlpackage").exists()


def test_a_file_that_is_not_stablehlo_is_refused(tmp_path):
    path = tmp_path / "junk.mlir"
    path.write_text("this is not MLIR")
    recipe = tmp_path / "junk.yaml"
    recipe.write_text(f"edgebuild: 1\nname: junk\nsource: {{model: {path.name}}}\noutputs: {{dir: build}}\n")
    code, result = run(recipe, tmp_path / "cache")
    assert code == 1
    assert "junk.mlir: not a StableHLO module" in json.dumps(result)


FACTORY = '''
import jax, jax.numpy as jnp
import flax.linen as nn

class Tagger(nn.Module):
    @nn.compact
    def __call__(self, x, mask):
        h = nn.relu(nn.Dense(24)(x))
        return nn.Dense(5)(h) * mask[..., None]

def make():
    model = Tagger()
    params = model.init(jax.random.key(0), jnp.zeros((2, 7, 12)), jnp.ones((2, 7)))
    return model.apply, params
'''


def write_weights(folder: Path, suffix: str, shift: float) -> Path:
    """The factory's parameters, changed by ``shift`` so the file (not the factory) decides them."""
    import importlib

    from flax import serialization

    from edgebuild_jax.function_source import path_key

    module = importlib.import_module("jax_tagger")
    _, params = module.make()
    params = jax.tree_util.tree_map(lambda a: np.asarray(a) + shift, params)
    path = folder / f"tagger{suffix}"
    if suffix == ".msgpack":
        path.write_bytes(serialization.to_bytes(params))
    else:
        flat = {path_key(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(params)[0]}
        if suffix == ".npz":
            np.savez(path, **flat)
        else:
            from safetensors.numpy import save_file

            save_file(flat, str(path))
    return path


@pytest.mark.parametrize("suffix", [".msgpack", ".safetensors", ".npz"])
def test_a_jax_function_with_weights_from_a_file(tmp_path, monkeypatch, suffix):
    (tmp_path / "jax_tagger.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    weights = write_weights(tmp_path, suffix, shift=0.05)
    metrics = build_validated(tmp_path, "tagger", f"""  model: {weights.name}
  format: stablehlo
  inputs:
    x: {{shape: [2, 7, 12], dtype: float32}}
    mask: {{shape: [2, 7], dtype: float32}}
  options: {{factory: "jax_tagger:make", output_names: [scores]}}
""")
    assert set(metrics) == {"scores"}
    import onnx

    imported = onnx.load(str(next((tmp_path / "cache").rglob("model.onnx"))), load_external_data=False)
    assert [i.name for i in imported.graph.input] == ["x", "mask"]  # the parameters are initializers
    assert len(imported.graph.initializer) >= 4


def test_weights_that_do_not_fit_the_factory_are_named(tmp_path, monkeypatch):
    (tmp_path / "jax_tagger.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    np.savez(tmp_path / "wrong.npz", **{"params/Dense_0/kernel": np.zeros((3, 3), np.float32)})
    recipe = tmp_path / "wrong.yaml"
    recipe.write_text("""edgebuild: 1
name: wrong
source:
  model: wrong.npz
  format: stablehlo
  inputs: {x: {shape: [2, 7, 12], dtype: float32}, mask: {shape: [2, 7], dtype: float32}}
  options: {factory: "jax_tagger:make"}
outputs: {dir: build}
""")
    code, result = run(recipe, tmp_path / "cache")
    assert code == 1
    assert "wrong.npz: the weights do not fit the factory's parameters: missing" in json.dumps(result)


def symbolic_batch_source(folder: Path) -> Path:
    from jax import export as jax_export

    (batch,) = jax_export.symbolic_shape("b")
    exported = export(lambda x: jax.nn.softmax(jnp.tanh(x @ W1), axis=-1),
                      jax.ShapeDtypeStruct((batch, 16), np.float32))
    path = folder / "dyn.jaxexport"
    path.write_bytes(bytes(exported.serialize()))
    return path


def test_a_dynamic_dim_the_recipe_does_not_pin_is_refused_naming_the_input(tmp_path):
    source = symbolic_batch_source(tmp_path)
    recipe = tmp_path / "dyn.yaml"
    recipe.write_text(f"edgebuild: 1\nname: dyn\nsource: {{model: {source.name}}}\noutputs: {{dir: build}}\n")
    code, result = run(recipe, tmp_path / "cache")
    assert code == 1
    assert "input 'x' has a dynamic dim 0" in json.dumps(result)


def test_a_symbolic_batch_pinned_by_the_recipe_builds_and_validates(tmp_path):
    source = symbolic_batch_source(tmp_path)
    metrics = build_validated(tmp_path, "dyn", f"""  model: {source.name}
  inputs: {{x: {{shape: [3, 16], dtype: float32}}}}
""")
    assert len(metrics) == 1
