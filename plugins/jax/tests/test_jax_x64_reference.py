"""A module traced with 64-bit types (jax_enable_x64 on at export) as the validation reference."""

import json

import numpy as np

from jax_checks import jax, jnp
from test_jax_recipes import run


def _x64_export():
    from jax import export as jax_export

    table = np.arange(40, dtype=np.float32).reshape(10, 4)

    def embed(x, ids):
        return x * 2 + jnp.take(jnp.asarray(table), ids, axis=0).sum(axis=-1), ids + 1

    with jax.enable_x64(True):
        return jax_export.export(jax.jit(embed))(jax.ShapeDtypeStruct((3,), jnp.float32),
                                                 jax.ShapeDtypeStruct((3,), jnp.int64))


def test_the_reference_runs_a_64_bit_module_with_x64_on():
    from edgebuild_jax.reference import JaxRunner

    runner = JaxRunner(_x64_export(), ["x", "ids"], ["y", "next"], {})
    assert runner.input_specs["ids"]["dtype"] == "int64"
    out = runner({"x": np.ones(3, np.float32), "ids": np.array([9, 0, 3], np.int64)})
    assert out["next"].dtype == np.int64 and out["next"].tolist() == [10, 1, 4]
    np.testing.assert_allclose(out["y"], [2 + 150, 2 + 6, 2 + 54])


def test_a_64_bit_export_builds_and_validates(tmp_path):
    (tmp_path / "embed.jaxexport").write_bytes(bytes(_x64_export().serialize()))
    recipe = tmp_path / "embed.yaml"
    recipe.write_text("""edgebuild: 1
name: embed
source: {model: embed.jaxexport, options: {input_names: [x, ids], output_names: [y, next]}}
target: {backend: coreml, precision: float32}
validate:
  samples: 2
  inputs: {ids: {random: {low: 0, high: 10, seed: 0}}}
  thresholds: {cosine_min: 0.9999}
outputs: {dir: build}
""")
    code, result = run(recipe, tmp_path / "cache")
    (variant,) = result["variants"]
    assert code == 0 and variant["status"] == "built", variant
    report = json.loads((tmp_path / "build" / "default" / "report.json").read_text())
    assert report["validation"]["failures"] == []
