"""A Llama-style decoder step exported with jax.export, its KV cache explicit inputs and outputs
(written with dynamic_update_slice at the position), built from a generative recipe into a stateful
Core ML package and validated by greedy generation against JAX running the same step."""

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from jax_checks import jax  # noqa: F401  (skips the module without JAX)
from jax_llama_step import Config, cache_names, export_step, greedy, random_params

PROMPTS = [[1, 17, 93, 5, 42], [1, 200]]
NEW_TOKENS = 10


def run(recipe: Path, cache: Path) -> tuple[int, dict]:
    from rich.console import Console

    from edgebuild.build.run import run_recipes

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run_recipes([str(recipe)], cache_dir=str(cache), as_json=True, console=Console(file=io.StringIO()))
    return code, json.loads(out.getvalue())


def write_recipe(folder: Path, config: Config, *, position_shape=(), names=None, cache="auto",
                 logits="all", max_context=None, params=None) -> Path:
    """The step exported to ``step.jaxexport`` and a recipe building it at fp32 and fp16."""
    (folder / "step.jaxexport").write_bytes(bytes(export_step(config, params, position_shape=position_shape)
                                                  .serialize()))
    inputs, outputs = names or cache_names(config)
    cache_yaml = cache if cache == "auto" else json.dumps([{"input": i, "output": o} for i, o in cache])
    recipe = folder / "decoder.yaml"
    recipe.write_text(f"""edgebuild: 1
name: jax_decoder
source:
  model: step.jaxexport
  options:
    input_names: {json.dumps(inputs)}
    output_names: {json.dumps(outputs)}
target: {{backend: coreml, deployment_target: iOS18, precision: float16}}
compute: {{policy: cpu_and_gpu}}
generate:
  max_context: {max_context or config.max_context}
  query_lengths: [1]
  logits: {logits}
  cache: {cache_yaml}
validate:
  generation:
    prompts: {json.dumps(PROMPTS)}
    new_tokens: {NEW_TOKENS}
  thresholds: {{token_agreement_min: 1.0, step_cosine_min: 0.9999}}
variants:
  fp32: {{target: {{precision: float32}}}}
  fp16: {{validate: {{thresholds: {{token_agreement_min: 1.0, step_cosine_min: 0.999}}}}}}
outputs: {{dir: build}}
""")
    return recipe


def built(folder: Path, recipe: Path) -> dict:
    """Build every variant; each one's generation record (interpreter) by variant name."""
    code, result = run(recipe, folder / "cache")
    assert code == 0, json.dumps(result)[:3000]
    records = {}
    for variant in result["variants"]:
        assert variant["status"] == "built", variant
        report = json.loads((folder / "build" / variant["variant"] / "report.json").read_text())
        validation = report["validation"]
        assert validation["reference"] == "stablehlo (eager), greedy generation"
        assert validation["failures"] == []
        records[variant["variant"]] = validation["runtimes"]["interpreter"]["generation"]
    return records


def package_description(folder: Path, variant: str):
    import coremltools as ct

    return ct.utils.load_spec(str(folder / "build" / variant / "model.mlpackage")).description


def check_generation(records: dict, config: Config, params: dict) -> None:
    """Both sides agree on every token, and JAX's side is the step function's own greedy tokens."""
    truth = {tuple(p): tokens for p, tokens in zip(PROMPTS, greedy(config, params, PROMPTS, NEW_TOKENS))}
    for variant, record in records.items():
        floor = 0.9999 if variant == "fp32" else 0.999
        assert record["mean_agreement"] == 1.0 and record["first_divergence"] is None, (variant, record)
        assert record["worst_step_cosine"] >= floor, (variant, record["worst_step_cosine"])
        for prompt in record["prompts"]:
            assert prompt["source_tokens"] == truth[tuple(prompt["prompt"])]
            assert prompt["artifact_tokens"] == prompt["source_tokens"]
        print(f"{variant}: worst step cosine {record['worst_step_cosine']:.9f}")


# grouped-query attention runs by default (about 20 s); one and four key/value heads with -m slow
@pytest.mark.parametrize("kv_heads", [2, pytest.param(1, marks=pytest.mark.slow),
                                      pytest.param(4, marks=pytest.mark.slow)],
                         ids=["grouped", "multi-query", "multi-head"])
def test_a_jax_decoder_step_generates_as_jax_does_at_fp32_and_fp16(tmp_path, kv_heads):
    config = Config(kv_heads=kv_heads)
    params = random_params(config)
    records = built(tmp_path, write_recipe(tmp_path, config, params=params))
    assert set(records) == {"fp32", "fp16"}
    check_generation(records, config, params)
    description = package_description(tmp_path, "fp16")
    assert [i.name for i in description.input] == ["input_ids", "position"]
    assert [o.name for o in description.output] == ["logits"]  # the new cache goes to the states
    states = {s.name: list(s.type.stateType.arrayType.shape) for s in description.state}
    shape = [1, kv_heads, config.max_context, config.head_dim]
    assert states == {f"past_key_values_{i}_{kind}": shape for i in range(config.layers) for kind in ("key", "value")}


def test_cache_names_paired_explicitly_a_position_of_shape_1_and_last_token_logits(tmp_path):
    config = Config(layers=1, max_context=24)
    params = random_params(config, seed=3)
    names = (["input_ids", "position", "k_cache_0", "v_cache_0"], ["logits", "k_next_0", "v_next_0"])
    recipe = write_recipe(tmp_path, config, params=params, position_shape=(1,), names=names,
                          cache=[("k_cache_0", "k_next_0"), ("v_cache_0", "v_next_0")], logits="last_token")
    check_generation(built(tmp_path, recipe), config, params)
    description = package_description(tmp_path, "fp32")
    assert {s.name for s in description.state} == {"k_cache_0", "v_cache_0"}
    metadata = json.loads(description.metadata.userDefined["edgebuild.generate"])
    assert metadata["logits"] == "last_token" and metadata["max_context"] == 24


def test_a_cache_shorter_than_max_context_is_refused_naming_both(tmp_path):
    config = Config(layers=1)
    recipe = write_recipe(tmp_path, config, max_context=config.max_context * 2)
    code, result = run(recipe, tmp_path / "cache")
    assert code == 1
    text = json.dumps(result)
    assert f"cache input 'past_key_values.0.key' holds {config.max_context} positions" in text
    assert f"generate.max_context is {config.max_context * 2}" in text


def test_cache_auto_without_cache_names_says_what_the_model_takes(tmp_path):
    config = Config(layers=1)
    names = (["input_ids", "position", "k0", "v0"], ["logits", "k0_out", "v0_out"])
    code, result = run(write_recipe(tmp_path, config, names=names), tmp_path / "cache")
    assert code == 1
    text = json.dumps(result)
    assert "cache: auto found no past_key_values" in text and "k0" in text


# --- docs/stablehlo.md, "Generating text with a JAX decoder": its blocks run as written --------------

DOCS = Path(__file__).resolve().parents[3] / "docs" / "stablehlo.md"
SECTION = "## Generating text with a JAX decoder"


def section_blocks(language: str) -> list[str]:
    """The section's fenced blocks in ``language`` (``<!-- fragment -->`` blocks left out)."""
    text = DOCS.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    lines, found, i = text[start:end if end > 0 else None].splitlines(), [], 0
    while i < len(lines):
        if lines[i].strip() == f"```{language}" and (i == 0 or lines[i - 1].strip() != "<!-- fragment -->"):
            j = lines.index("```", i + 1)
            found.append("\n".join(lines[i + 1:j]) + "\n")
            i = j
        i += 1
    return found


def test_the_docs_section_on_jax_decoders_runs_as_written(tmp_path):
    import subprocess
    import sys

    (script,), (recipe,) = section_blocks("python"), section_blocks("yaml")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "decoder_step.jaxexport").is_file()
    (tmp_path / "decoder_step.yaml").write_text(recipe)
    code, result = run(tmp_path / "decoder_step.yaml", tmp_path / "cache")
    assert code == 0, json.dumps(result)[:3000]
    assert [v["variant"] for v in result["variants"]] == ["fp32", "fp16"]
    for variant in result["variants"]:
        assert variant["status"] == "built"
        report = json.loads((tmp_path / "build" / "decoder-step" / variant["variant"] / "report.json").read_text())
        validation = report["validation"]
        assert validation["reference"] == "stablehlo (eager), greedy generation" and validation["failures"] == []
        record = validation["runtimes"]["interpreter"]["generation"]
        assert record["mean_agreement"] == 1.0 and record["worst_step_cosine"] >= 0.999
        print(f"docs step {variant['variant']}: worst step cosine {record['worst_step_cosine']:.9f}")


def test_the_same_step_as_an_onnx_decoder_builds_and_validates_against_onnxruntime(tmp_path):
    """The whole-length cache and the position input are the lowering's, not the JAX frontend's: the
    step converted to ONNX builds the same way, onnxruntime generating as the reference."""
    from jax_checks import to_onnx

    config = Config(layers=1)
    params = random_params(config, seed=5)
    inputs, outputs = cache_names(config)
    (tmp_path / "step.onnx").write_bytes(
        to_onnx(export_step(config, params), input_names=inputs, output_names=outputs).SerializeToString())
    recipe = write_recipe(tmp_path, config, params=params)
    text = recipe.read_text().replace("model: step.jaxexport", "model: step.onnx")
    recipe.write_text("\n".join(line for line in text.splitlines() if "_names:" not in line and
                                line.strip() != "options:") + "\n")
    code, result = run(recipe, tmp_path / "cache")
    assert code == 0, json.dumps(result)[:3000]
    truth = greedy(config, params, PROMPTS, NEW_TOKENS)
    for variant in result["variants"]:
        validation = json.loads((tmp_path / "build" / variant["variant"] / "report.json").read_text())["validation"]
        assert validation["reference"] == "onnxruntime, greedy generation" and validation["failures"] == []
        record = validation["runtimes"]["interpreter"]["generation"]
        assert [p["source_tokens"] for p in record["prompts"]] == truth
        assert record["mean_agreement"] == 1.0
