"""``validate.reference: float64`` for StableHLO sources: the module restated in float64 and run by JAX."""

import json
from pathlib import Path

import numpy as np
import pytest

from edgebuild.plugin import BuildError
from edgebuild_jax import conformance
from edgebuild_jax.float64 import float64_runner
from jax_checks import export, jax, jnp
from test_jax_recipes import FACTORY, run, write_source, write_weights


def _runner(exported, n_in, n_out):
    names, outputs = [f"a{i}" for i in range(n_in)], [f"o{i}" for i in range(n_out)]
    run64, evaluator = float64_runner(bytes(exported.mlir_module_serialized), origin="case.mlir",
                                      input_names=names, output_names=outputs)
    return lambda *arrays: [run64(dict(zip(names, arrays)))[o] for o in outputs], evaluator


VARIANTS = list(conformance._variants())


CI_SHARE = 6  # every sixth variant in CI, the rest in the slow suite: each costs an export and two runs


@pytest.mark.parametrize("index", [pytest.param(i, marks=() if i % CI_SHARE == 0 else pytest.mark.slow)
                                   for i in range(len(VARIANTS))], ids=[f"{p}-{v}" for p, v, _, _ in VARIANTS])
def test_every_primitive_computes_in_float64_what_it_computes_in_float32(index):
    """Each conformance variant (every lax primitive over its dtypes and attributes): float32 values
    become float64, every other type stays, and the results agree with JAX's own run."""
    primitive, variant, fn, specs = VARIANTS[index]
    arrays = conformance._arrays(index, *specs)
    exported = conformance._export(fn, arrays)
    expected = [np.asarray(v) for v in jax.tree_util.tree_leaves(exported.call(*arrays))]
    run64, evaluator = _runner(exported, len(arrays), len(expected))
    assert evaluator == "JAX, x64"
    for want, got in zip(expected, run64(*arrays)):
        assert got.dtype == (np.float64 if want.dtype == np.float32 else want.dtype), (want.dtype, got.dtype)
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got, want.astype(np.float64), rtol=1e-3, atol=1e-3)
        else:
            np.testing.assert_array_equal(got, want)


def test_the_float64_result_is_the_exact_one():
    """Long sums and cancellation: float32 JAX is visibly off the float64 numpy answer, the
    restated module is not (the check can fail: a module left in float32 would be as far)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 256)).astype(np.float32)

    def f(x):
        h = jnp.tanh(x @ w) * 1e4
        return jax.nn.softmax(h - h.mean(axis=-1, keepdims=True) + 1.0, axis=-1), (h + 1e4).sum() - 1e4 * h.size

    x = rng.standard_normal((4, 256)).astype(np.float32)
    exported = export(f, x)
    run64, _ = _runner(exported, 1, 2)
    got = run64(x)
    h = np.tanh(x.astype(np.float64) @ w.astype(np.float64)) * 1e4
    z = h - h.mean(axis=-1, keepdims=True) + 1.0
    softmax = np.exp(z - z.max(axis=-1, keepdims=True))
    softmax /= softmax.sum(axis=-1, keepdims=True)
    exact = [softmax, (h + 1e4).sum() - 1e4 * h.size]
    f32 = [np.asarray(v, np.float64) for v in exported.call(x)]
    for ours, theirs, truth in zip(got, f32, exact):
        assert np.abs(ours - truth).max() < 1e-6 * max(1.0, np.abs(truth).max())
    assert np.abs(f32[1] - exact[1]) > 1e3 * np.abs(got[1] - exact[1])


def test_float16_and_bfloat16_parts_stay_as_written():
    def f(x):
        half = x.astype(jnp.float16) * jnp.float16(3)
        return half, (x.astype(jnp.bfloat16) + 1).astype(jnp.float32)

    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    exported = export(f, x)
    run64, _ = _runner(exported, 1, 2)
    half, rounded = run64(x)
    assert half.dtype == np.float16 and rounded.dtype == np.float64
    np.testing.assert_array_equal(half, np.asarray(exported.call(x)[0]))
    import ml_dtypes

    # bf16 arithmetic as the module states it (XLA's float32 run may skip the rounding of the sum)
    expected = (x.astype(ml_dtypes.bfloat16) + ml_dtypes.bfloat16(1)).astype(np.float64)
    np.testing.assert_array_equal(rounded, expected)


def test_reinterpreted_float_bits_are_refused_by_op_and_line():
    exported = export(lambda x: jax.lax.bitcast_convert_type(x * 2, jnp.int32), np.zeros(3, np.float32))
    with pytest.raises(BuildError) as error:
        _runner(exported, 1, 1)
    assert "stablehlo.bitcast_convert" in error.value.message and "test_jax_float64.py" in error.value.message
    assert "float32" in error.value.hint


def test_symbolic_shapes_are_refused():
    from jax import export as jax_export

    (batch,) = jax_export.symbolic_shape("b")
    exported = jax_export.export(jax.jit(lambda x: x * 2))(jax.ShapeDtypeStruct((batch, 3), jnp.float32))
    with pytest.raises(BuildError, match="symbolic shapes"):
        _runner(exported, 1, 1)


def _float64_recipe(folder: Path, name: str, source: str) -> dict:
    recipe = folder / f"{name}.yaml"
    recipe.write_text(f"edgebuild: 1\nname: {name}\nsource:\n{source}" + """target: {backend: coreml, precision: float32}
validate:
  samples: 2
  reference: float64
  thresholds: {cosine_min: 0.9999, max_abs_max: 1e-3}
outputs: {dir: build}
""")
    code, result = run(recipe, folder / "cache")
    (variant,) = result["variants"]
    assert code == 0 and variant["status"] == "built", variant
    return json.loads((folder / "build" / "default" / "report.json").read_text())["validation"]


@pytest.mark.parametrize("form", ["jaxexport", "mlir"])
def test_a_recipe_validates_a_jax_export_against_float64(tmp_path, form):
    source = write_source(tmp_path, form)
    validation = _float64_recipe(tmp_path, "mlp", f"""  model: {source.name}
  inputs: {{scale: {{value: 1.5}}}}
  options: {{output_names: [probabilities, features]}}
""")
    assert validation["reference"] == "float64 (JAX, x64)" and validation["failures"] == []
    assert set(validation["runtimes"]["interpreter"]["metrics"]) == {"probabilities", "features"}


def test_a_jax_function_with_weights_validates_against_float64(tmp_path, monkeypatch):
    (tmp_path / "jax_tagger.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    weights = write_weights(tmp_path, ".npz", shift=0.05)
    validation = _float64_recipe(tmp_path, "tagger", f"""  model: {weights.name}
  format: stablehlo
  inputs:
    x: {{shape: [2, 7, 12], dtype: float32}}
    mask: {{shape: [2, 7], dtype: float32}}
  options: {{factory: "jax_tagger:make", output_names: [scores]}}
""")
    assert validation["reference"] == "float64 (JAX, x64)" and validation["failures"] == []
