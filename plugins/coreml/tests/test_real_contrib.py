"""Real models through the com.microsoft lowerings, each derived from a shipped recipe's pinned
source with onnxruntime's own tools and built with ``edgebuild run --json``:

- MatMulNBits: paraphrase-MiniLM-L3 (recipes/minilm_paraphrase.yaml) with every MatMul weight
  quantised to 4 bits by MatMulNBitsQuantizer, built for iOS18 at fp32. The reference is
  onnxruntime on that 4-bit source; the package keeps the weights at 4 bits.
- The transformer optimiser (onnxruntime.transformers.optimizer, model_type bert, attention
  fusion off) on both MiniLMs (minilm_paraphrase.yaml, minilm_int8.yaml). The test first checks
  which com.microsoft ops the optimiser wrote, so it fails if a newer onnxruntime stops
  emitting one, and that they reached the lowering (the optimise stage's report).

Every float output must reach cosine >= 0.9999 against onnxruntime (the recipes' own, stricter
thresholds hold too: the variant is "built" only when they pass). The 4-bit build at block
size 32 runs by default; the rest under ``-m slow``.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from edgebuild_testplugin.sources import shipped_source

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = 4
COSINE_MIN = 0.9999
MS = "com.microsoft"
# what onnxruntime's optimiser writes into each MiniLM with the attention fusion off
OPTIMISER_OPS = {
    "minilm_paraphrase": {"SkipLayerNormalization", "BiasGelu", "EmbedLayerNormalization"},
    "minilm_int8": {"SkipLayerNormalization", "BiasGelu"},
}


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory) -> Path:
    """One store and one source folder for the module: each model is downloaded once."""
    return tmp_path_factory.mktemp("real-contrib-cache")


def build(recipe: str, model: onnx.ModelProto, workdir: Path, cache: Path, *, target: str | None = None) -> tuple[dict, dict]:
    """``edgebuild run --json`` (variant fp32) of the shipped recipe with ``model`` as its source;
    (variant record, report.json)."""
    source = workdir / "source.onnx"
    onnx.save(model, source)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    lines = [f"extends: {json.dumps(str(ROOT / 'recipes' / f'{recipe}.yaml'))}",
             f"source: {{model: source.onnx, sha256: {digest}}}",
             f"validate: {{samples: {SAMPLES}}}", "outputs: {dir: out}"]
    if target:
        lines.append(f"target: {{deployment_target: {target}}}")
    (workdir / "recipe.yaml").write_text("\n".join(lines) + "\n")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    done = subprocess.run(
        [sys.executable, "-m", "edgebuild.cli.app", "run", "recipe.yaml", "--variant", "fp32", "--cache-dir", str(cache),
         "--json"], capture_output=True, text=True, cwd=workdir, env=env, timeout=1800,
    )
    assert done.stdout.strip(), f"no JSON on stdout (exit {done.returncode}):\n{done.stderr[-3000:]}"
    [record] = json.loads(done.stdout)["variants"]
    assert record["status"] == "built", f"{recipe} failed: {record.get('error')}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((Path(record["output_dir"]) / "report.json").read_text())
    return record, report


def check_cosine(record: dict) -> dict[str, float]:
    """Every float output at cosine >= COSINE_MIN on every sample; {output: worst cosine}."""
    validation = record["validation"]
    assert validation["samples"] == SAMPLES and validation["failures"] == []
    metrics = validation["runtimes"]["interpreter"]["metrics"]
    worst = {name: values["cosine"]["min"] for name, values in metrics.items() if "cosine" in values}
    assert worst, "no float outputs were compared"
    for name, value in worst.items():
        assert value >= COSINE_MIN, f"{name}: cosine {value}"
    return worst


def contrib_ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node if n.domain == MS)


# -- MatMulNBits ----------------------------------------------------------------------------
def quantised_4bit(path: Path, *, block_size: int, symmetric: bool) -> onnx.ModelProto:
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    config = DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=symmetric, bits=4)
    quantizer = MatMulNBitsQuantizer(onnx.load(path), algo_config=config)
    quantizer.process()
    return quantizer.model.model


def float_weight_bytes(model: onnx.ModelProto, *, matmul_only: bool) -> int:
    """Bytes of the model's float32 initializers (those MatMul reads, with ``matmul_only``)."""
    read = {n.input[1] for n in model.graph.node if n.op_type == "MatMul"} if matmul_only else None
    return sum(4 * int(np.prod(t.dims)) for t in model.graph.initializer
               if t.data_type == onnx.TensorProto.FLOAT and (read is None or t.name in read))


def run_matmul_nbits(block_size: int, symmetric: bool, cache: Path, workdir: Path) -> None:
    from edgebuild_coreml.interpreter import load_mlpackage

    path = shipped_source("minilm_paraphrase")
    original = onnx.load(path)
    model = quantised_4bit(path, block_size=block_size, symmetric=symmetric)
    weights = sum(1 for n in original.graph.node if n.op_type == "MatMul" and
                  n.input[1] in {t.name for t in original.graph.initializer})
    assert contrib_ops(model) == {"MatMulNBits": weights} and weights == 18
    record, report = build("minilm_paraphrase", model, workdir, cache, target="iOS18")
    worst = check_cosine(record)
    artifact = Path(record["artifacts"][0])
    ops = [op for op in load_mlpackage(artifact).functions["main"].operations]
    compressed = [op for op in ops if op.op_type == "constexpr_blockwise_shift_scale"]
    assert len(compressed) == weights
    from coremltools.converters.mil.mil import types

    assert {types.builtin_to_string(op.data.dtype) for op in compressed} == {"int4" if symmetric else "uint4"}
    # An fp32 package stores every float weight at 4 bytes (the shipped fp32 build: 68.6 MB);
    # here the MatMul weights shrink to 4 bits plus a scale (and zero point) per block.
    size = sum(f.stat().st_size for f in artifact.rglob("*") if f.is_file())
    fp32 = float_weight_bytes(original, matmul_only=False)
    matmul = float_weight_bytes(original, matmul_only=True)
    assert size < fp32 - 0.8 * matmul and size < 0.8 * fp32, (size, fp32, matmul)
    print(f"\nMatMulNBits block {block_size} {'sym' if symmetric else 'asym'}: cosine {worst}; "
          f"package {size / 1e6:.2f} MB, fp32 weights {fp32 / 1e6:.2f} MB (MatMul {matmul / 1e6:.2f} MB)")


def test_matmul_nbits_minilm_paraphrase(model_cache, tmp_path):
    run_matmul_nbits(32, False, model_cache, tmp_path)


@pytest.mark.slow
def test_matmul_nbits_minilm_paraphrase_block_128_symmetric(model_cache, tmp_path):
    run_matmul_nbits(128, True, model_cache, tmp_path)


# -- the transformer optimiser ---------------------------------------------------------------
def optimised(path: Path, *, attention: bool = False) -> onnx.ModelProto:
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import FusionOptions

    options = FusionOptions("bert")
    options.enable_attention = attention  # the attention family is tested on its own too
    return optimizer.optimize_model(str(path), model_type="bert", optimization_options=options, use_gpu=False).model


@pytest.mark.slow
@pytest.mark.parametrize("recipe", sorted(OPTIMISER_OPS))
def test_transformer_optimiser_minilm(recipe, model_cache, tmp_path):
    model = optimised(shipped_source(recipe))
    emitted = contrib_ops(model)
    assert set(emitted) == OPTIMISER_OPS[recipe], emitted
    record, report = build(recipe, model, tmp_path, model_cache)
    lowered = {k.split("::")[1]: v for k, v in report["optimize"]["op_counts_after"].items() if k.startswith(MS + "::")}
    assert lowered == dict(emitted), lowered  # every fused node reached the Core ML lowering
    worst = check_cosine(record)
    print(f"\n{recipe} optimised ({dict(emitted)}): cosine {worst}")


@pytest.mark.slow
def test_transformer_optimiser_every_fusion_minilm_paraphrase(model_cache, tmp_path):
    """The optimiser with every fusion on: attention, layer norms, GELU and the embedding together."""
    model = optimised(shipped_source("minilm_paraphrase"), attention=True)
    emitted = contrib_ops(model)
    assert set(emitted) == OPTIMISER_OPS["minilm_paraphrase"] | {"Attention"}, emitted
    record, report = build("minilm_paraphrase", model, tmp_path, model_cache)
    lowered = {k.split("::")[1]: v for k, v in report["optimize"]["op_counts_after"].items() if k.startswith(MS + "::")}
    assert lowered == dict(emitted), lowered
    worst = check_cosine(record)
    print(f"\nminilm_paraphrase, every fusion ({dict(emitted)}): cosine {worst}")
