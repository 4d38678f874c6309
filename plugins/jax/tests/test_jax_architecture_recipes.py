"""Architectures from published configurations (jax_architecture_models says which, and how they
are scaled), each exported with jax.export, built from a recipe at float32 and at float16 with
`edgebuild run`, and validated against JAX running the same export (the frontend's reference).

Measured on Linux with the MIL interpreter (3 samples each, the worst output's lowest cosine;
`pytest -s -m "slow or not slow"` prints them):

| architecture | float32 | float16 |
| --- | --- | --- |
| ResNet-18 layout | 1.000000000 | 0.999998699 |
| BERT-base layout (sequence output, pooled output) | 1.000000000 | 0.999999073 |
| GRU (nn.scan) | 1.000000000 | 0.999997047 |
| LSTM language model (lax.scan) | 1.000000000 | 0.999999920 |
"""

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from jax_checks import export
from jax_architecture_models import ARCHITECTURES

# the lowest cosine each precision must keep against JAX
LIMITS = {"float32": 0.99999, "float16": 0.999}
# The default run builds the cheapest of each kind at float16: the CNN, the encoder and the LSTM (the
# recurrent net no other test converts); the rest run with -m slow. Every case takes 3-25 s alone on
# a loaded 2-core machine; the first build of a process pays JAX's and coremltools' start-up, ~40 s.
SLOW = {("resnet18", "float32"), ("bert_base", "float32"), ("gru", "float32"), ("gru", "float16"),
        ("lstm_scan", "float32")}


def build(folder: Path, name: str, precision: str) -> dict:
    """The architecture exported, built from a recipe at ``precision`` and validated against JAX;
    the variant's report."""
    from rich.console import Console

    from edgebuild.build.run import run_recipes

    fn, example, names, draws = ARCHITECTURES[name](np.random.default_rng(0))
    source = folder / f"{name}.jaxexport"
    source.write_bytes(bytes(export(fn, *example).serialize()))
    drawn = ", ".join(f"{n}: {{random: {d}}}" for n, d in zip(names, draws))
    recipe = folder / f"{name}.yaml"
    recipe.write_text(f"""edgebuild: 1
name: {name}
source:
  model: {source.name}
  options: {{input_names: {json.dumps(names)}}}
target: {{backend: coreml, precision: {precision}}}
validate:
  samples: 3
  inputs: {{{drawn}}}
  thresholds: {{cosine_min: {LIMITS[precision]}}}
outputs: {{dir: build}}
""")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run_recipes([str(recipe)], cache_dir=str(folder / "cache"), as_json=True,
                           console=Console(file=io.StringIO()))
    (variant,) = json.loads(out.getvalue())["variants"]
    assert code == 0 and variant["status"] == "built", json.dumps(variant)[:3000]
    return json.loads((folder / "build" / "default" / "report.json").read_text())


RECURRENT = {"gru", "lstm_scan"}
CASES = [pytest.param(name, precision, id=f"{name}-{precision}",
                      marks=[pytest.mark.slow] if (name, precision) in SLOW else [])
         for name in ARCHITECTURES for precision in LIMITS]


@pytest.mark.parametrize("name, precision", CASES)
def test_an_architecture_builds_from_a_recipe_and_validates_against_jax(tmp_path, name, precision):
    report = build(tmp_path, name, precision)
    if name in RECURRENT:  # the scan reached the converter as a loop, not unrolled
        assert "stablehlo.while" in report["import"]["stablehlo_ops"]
    validation = report["validation"]
    assert validation["reference"] == "stablehlo (eager)"
    assert validation["failures"] == [] and validation["samples"] == 3
    metrics = validation["runtimes"]["interpreter"]["metrics"]
    worst = min(output["cosine"]["min"] for output in metrics.values())
    print(f"{name} {precision}: worst cosine against JAX {worst:.9f} over {sorted(metrics)}")
    assert worst >= LIMITS[precision]
    errors = [output["max_abs"]["max"] for output in metrics.values()]
    if precision == "float16":  # the package computes in float16: close to JAX, not bit-equal
        assert all(error > 0 for error in errors)
    else:
        assert all(error < 1e-3 for error in errors)
