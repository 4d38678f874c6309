"""A StableHLO source at every ``optimize.level``: the converted graph reaches the optimize stage as
any ONNX model does, and the package validates against JAX at O0 (no rewrite rule, no fusion) as
at O3."""

import json

import numpy as np
import pytest

from jax_checks import export, jax

RNG = np.random.default_rng(1)
W1 = RNG.standard_normal((16, 32)).astype(np.float32) * 0.3
W2 = RNG.standard_normal((32, 4)).astype(np.float32) * 0.3


def block(x):
    """Two matrix products (``fuse_bias`` makes each an edgebuild::Linear at O2 and up), a
    normalisation written out, GELU and softmax between them."""
    hidden = x @ W1
    mean = hidden.mean(-1, keepdims=True)
    centred = hidden - mean
    normed = centred / jax.numpy.sqrt((centred * centred).mean(-1, keepdims=True) + 1e-5)
    return jax.nn.softmax(jax.nn.gelu(normed) @ W2, axis=-1)


@pytest.mark.parametrize("level", ["O0", "O3"])
def test_a_jax_export_builds_and_validates_at_the_ends_of_the_levels(tmp_path, level):
    from test_jax_recipes import run

    source = tmp_path / "block.jaxexport"
    source.write_bytes(bytes(export(block, np.zeros((2, 16), np.float32)).serialize()))
    recipe = tmp_path / "block.yaml"
    recipe.write_text(f"""edgebuild: 1
name: block
source: {{model: {source.name}}}
target: {{backend: coreml, precision: float32}}
optimize: {{level: {level}}}
validate:
  samples: 3
  thresholds: {{cosine_min: 0.9999}}
outputs: {{dir: build}}
""")
    code, result = run(recipe, tmp_path / "cache")
    (variant,) = result["variants"]
    assert code == 0 and variant["status"] == "built", variant
    report = json.loads((tmp_path / "build" / "default" / "report.json").read_text())
    assert report["optimize"]["level"] == level
    validation = report["validation"]
    assert validation["reference"] == "stablehlo (eager)" and validation["failures"] == []
    assert all(m["cosine"]["min"] >= 0.9999 for m in validation["runtimes"]["interpreter"]["metrics"].values())
    ran, ops = report["optimize"]["rules"], report["optimize"]["op_counts_after"]
    if level == "O0":  # no fusion ran: the matrix products stay MatMul + Add
        assert "fuse_bias" not in ran and "edgebuild::Linear" not in ops and ops.get("MatMul") == 2, (ran, ops)
    else:
        assert ran["fuse_bias"] >= 1 and ops.get("edgebuild::Linear") == 2 and "MatMul" not in ops, (ran, ops)
