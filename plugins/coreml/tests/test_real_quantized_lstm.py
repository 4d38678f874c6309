"""Quantised LSTMs as users make them build and match onnxruntime: torch ``nn.LSTM`` -> onnxruntime.

Each model is a torch module with random weights (``nn.LSTM``: 1-3 layers, uni- or bidirectional,
batch first or not, with or without an initial state; an embedder: Embedding -> 3-layer LSTM over
64 tokens), exported by ``torch.onnx.export`` and quantised by onnxruntime's own tools as its
documentation asks (``quant_pre_process``, then ``quantize_dynamic``, which writes every LSTM as
com.microsoft DynamicQuantizeLSTM). A recipe pointing at the quantised file is built with
``edgebuild run --json`` at fp32 and fp16 and validated against onnxruntime on that source.

fp32: cosine >= 0.9999 on every output: the unrolled LSTM sums onnxruntime's integer products
exactly and scales them once, in its order; what differs is the float rounding of the gates'
activations. fp16 cannot be exact: a sum of 8-bit products beyond
2048 rounds in fp16, and the hidden state quantised every step carries such a step on; fp16 is held
to 0.999.

The weights are quantised with ``reduce_range`` (7 bits; quantize_dynamic writes LSTM weights as
int8 whatever its weight_type): onnxruntime's own x86 uint8 x int8 kernel on CPUs without VNNI sums
pairs of full-range products in int16 with saturation, so its result there is not the graph's
arithmetic (the embedder at full range: cosine 0.996 against the exact sums, on any decomposition).
The reference runs on one thread (OMP_NUM_THREADS=1): onnxruntime otherwise quantises each
thread's rows of a batch's hidden state apart.

One bidirectional 2-layer model runs by default; the rest under ``-m slow``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

FP32_COSINE = 0.9999
FP16_COSINE = 0.999
STEPS, BATCH, FEATURES, HIDDEN = 12, 2, 8, 16


@dataclass(frozen=True)
class Case:
    layers: int = 1
    bidirectional: bool = False
    batch_first: bool = False
    states: bool = False
    per_channel: bool = False

    @property
    def name(self) -> str:
        return (f"lstm{self.layers}{'_bi' if self.bidirectional else ''}{'_bf' if self.batch_first else ''}"
                f"{'_states' if self.states else ''}{'_per_channel' if self.per_channel else ''}")


class _LSTM(torch.nn.Module):
    def __init__(self, case: Case):
        super().__init__()
        self.lstm = torch.nn.LSTM(FEATURES, HIDDEN, num_layers=case.layers, bidirectional=case.bidirectional,
                                  batch_first=case.batch_first)
        self.states = case.states

    def forward(self, x, h0=None, c0=None):
        y, (h, c) = self.lstm(x, (h0, c0)) if self.states else self.lstm(x)
        return y, h, c


class _Embedder(torch.nn.Module):
    """Token ids -> embeddings -> a 3-layer LSTM: its sequence and last hidden states."""

    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(100, 32)
        self.lstm = torch.nn.LSTM(32, 64, num_layers=3, batch_first=True)

    def forward(self, ids):
        y, (h, _) = self.lstm(self.embedding(ids))
        return y, h


def _export(module: torch.nn.Module, args: tuple, names: list[str], path: Path) -> Path:
    torch.manual_seed(0)
    for p in module.parameters():  # random weights, reproducible
        torch.nn.init.uniform_(p, -0.3, 0.3)
    torch.onnx.export(module.eval(), args, str(path), input_names=names, dynamo=True)
    return path


def _quantize(source: Path, per_channel: bool = False) -> Path:
    """onnxruntime's pre-processing (folds the exporter's weight transposes), then quantize_dynamic."""
    from onnxruntime.quantization import quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared = source.with_name(source.stem + "_prepared.onnx")
    quant_pre_process(str(source), str(prepared))
    target = source.with_name(source.stem + "_dynamic.onnx")
    quantize_dynamic(prepared, target, reduce_range=True, per_channel=per_channel)
    return target


def _lstm_nodes(model: Path) -> int:
    import onnx

    proto = onnx.load(str(model))
    return sum(1 for n in proto.graph.node if (n.domain, n.op_type) == ("com.microsoft", "DynamicQuantizeLSTM"))


def _build(model: Path, inputs: dict, validate_inputs: str, workdir: Path, cache: Path, variant: str) -> dict:
    """``edgebuild run --json`` of a recipe for ``model``; the variant's record."""
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    shapes = "\n".join(f"    {name}: {{shape: {list(shape)}, dtype: {dtype}}}"
                       for name, (shape, dtype) in inputs.items())
    recipe = workdir / f"{model.stem}.yaml"
    recipe.write_text(
        "edgebuild: 1\n"
        f"name: {model.stem}\n"
        f"source:\n  model: {json.dumps(str(model))}\n  sha256: {digest}\n  inputs:\n{shapes}\n"
        "target: {backend: coreml, deployment_target: iOS17, precision: float32}\n"
        f"validate:\n  samples: 2\n{validate_inputs}"
        f"  thresholds: {{cosine_min: {FP32_COSINE}, max_rel_max: null}}\n"
        "variants:\n  fp32: {}\n"
        f"  fp16: {{target: {{precision: float16}}, validate: {{thresholds: {{cosine_min: {FP16_COSINE}}}}}}}\n"
        "outputs: {dir: out}\n"
    )
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-m", "edgebuild.cli.app", "run", str(recipe), "--variant", variant, "--cache-dir", str(cache),
         "--json"], capture_output=True, text=True, cwd=workdir, env=env, timeout=1800,
    )
    assert done.stdout.strip(), f"no JSON on stdout (exit {done.returncode}):\n{done.stderr[-3000:]}"
    [record] = json.loads(done.stdout)["variants"]
    assert record["status"] == "built", f"{model.name} {variant}: {record.get('error')}\n{done.stderr[-3000:]}"
    return record


def _cosines(record: dict) -> dict[str, float]:
    metrics = record["validation"]["runtimes"]["interpreter"]["metrics"]
    assert metrics
    for output, values in metrics.items():
        assert values["nonfinite"]["max"] == 0, output
    return {output: values["cosine"]["min"] for output, values in metrics.items()}


def _check_lstm(case: Case, tmp_path: Path, variants=("fp32", "fp16")) -> None:
    shape = (BATCH, STEPS, FEATURES) if case.batch_first else (STEPS, BATCH, FEATURES)
    args = [torch.randn(shape)]
    names = ["x"]
    inputs = {"x": (shape, "float32")}
    dirs = 2 if case.bidirectional else 1
    if case.states:
        state = (case.layers * dirs, BATCH, HIDDEN)
        args += [torch.zeros(state), torch.zeros(state)]
        names += ["h0", "c0"]
        inputs.update({"h0": (state, "float32"), "c0": (state, "float32")})
    source = _export(_LSTM(case), tuple(args), names, tmp_path / f"{case.name}.onnx")
    quantised = _quantize(source, case.per_channel)
    assert _lstm_nodes(quantised) == case.layers
    validate_inputs = "  inputs:\n" + "".join(
        f"    {n}: {{random: {{low: -0.5, high: 0.5, seed: {i}}}}}\n" for i, n in enumerate(names[1:], 1))
    validate_inputs = validate_inputs if case.states else ""
    for variant in variants:
        record = _build(quantised, inputs, validate_inputs, tmp_path, tmp_path / "cache", variant)
        cosines = _cosines(record)
        print(f"\n{case.name} {variant}: worst cosine per output {cosines}")
        limit = FP32_COSINE if variant == "fp32" else FP16_COSINE
        assert min(cosines.values()) >= limit, cosines


def test_bidirectional_stacked_lstm_dynamic_int8(tmp_path):
    _check_lstm(Case(layers=2, bidirectional=True, batch_first=True), tmp_path, variants=("fp32",))


SLOW_CASES = [
    Case(layers=1), Case(layers=1, bidirectional=True, states=True), Case(layers=2, batch_first=True, states=True),
    Case(layers=3, bidirectional=True), Case(layers=3, batch_first=True),
    Case(layers=2, bidirectional=True, per_channel=True), Case(layers=1, batch_first=True, per_channel=True),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW_CASES, ids=lambda c: c.name)
def test_lstm_forms_dynamic(case, tmp_path):
    _check_lstm(case, tmp_path)


@pytest.mark.slow
def test_lstm_embedder_dynamic(tmp_path):
    """The 3-layer embedder over 64 tokens: 192 hidden-state quantisations in a row."""
    source = _export(_Embedder(), (torch.randint(0, 100, (1, 64)),), ["ids"], tmp_path / "embedder.onnx")
    quantised = _quantize(source)
    assert _lstm_nodes(quantised) == 3
    validate_inputs = "  inputs:\n    ids: {tokens: {vocab_size: 100}}\n"
    for variant in ("fp32", "fp16"):
        record = _build(quantised, {"ids": ((1, 64), "int64")}, validate_inputs, tmp_path, tmp_path / "cache", variant)
        cosines = _cosines(record)
        print(f"\nembedder {variant}: worst cosine per output {cosines}")
        assert min(cosines.values()) >= (FP32_COSINE if variant == "fp32" else FP16_COSINE), cosines
