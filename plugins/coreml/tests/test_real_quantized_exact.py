"""Quantised graphs built at fp32 compute onnxruntime's integer arithmetic: the artifact equals
onnxruntime where only quantised matmuls/convolutions and Q/DQ lie between input and output, and an
fp16 build says it is not integer-exact.

- default run: small graphs quantised by onnxruntime's own tools (quantize_static QOperator,
  quantize_dynamic), through the optimise stage, lowered and run in the MIL interpreter, against
  onnxruntime on the quantised source: equal bit for bit at fp32;
- ``-m slow``: torchvision's resnet18 (random weights, exported with torch.onnx.export) quantised
  by quantize_static in the QOperator format, per channel and per tensor, built with
  ``edgebuild run`` at fp32 (cosine >= RESNET_COSINE against onnxruntime's integer kernels) and
  fp16 (the report says so); all-MiniLM-L6 quantised
  by quantize_dynamic (reduce_range on and off): the decomposed graph, run by onnxruntime, equals
  the source bit for bit, and the package is held to MINILM_L6_COSINE.

Why MiniLM stays below 0.9999 although its matmuls are exact: every layer requantises its input
at run time (DynamicQuantizeLinear), and the float ops in between (LayerNorm, GELU's erf,
softmax) differ from onnxruntime's in the last bit; one such bit on a rounding tie moves a value
one step, a step in a tensor's largest element moves its scale and so every value of it, and six
layers carry that on (measured: the first step appears in layer 2's GELU output, 2 of 196608
values). The reference itself is no closer: on the recipe's first 4 validation inputs (worst
cosine of last_hidden_state) onnxruntime ORT_ENABLE_ALL vs ORT_DISABLE_ALL 0.9877, ORT_DISABLE_ALL
vs onnx's ReferenceEvaluator 0.9921, vs the same graph with its float ops in float64 0.9978 (1 vs 2
threads: identical); the package against ORT_DISABLE_ALL is in that spread (0.9919), and its report
notes the run-time quantisation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest
from onnx_cases import IR_VERSION, lower, lower_and_run, run_onnxruntime
from test_real_quantized_dynamic import _minilm_l6_onnx

from edgebuild.graph.optimize import optimize

ROOT = Path(__file__).resolve().parents[3]
F = onnx.TensorProto.FLOAT
RNG = np.random.default_rng(11)
# resnet18 QOperator, measured fp32 1.000000 per channel and per tensor (the float form: 0.999889;
# 0.9999 while each QuantizeLinear by a constant scale multiplied by the reciprocal, which rounds
# ties differently from onnxruntime's division: edgebuild::divide_to_multiply keeps those divisions)
RESNET_COSINE = 0.99999
MINILM_L6_COSINE = 0.985
FP16_NOTE = "quantised arithmetic is not integer-exact at float16"
RUNTIME_QUANT_NOTE = "the graph quantises at run time (DynamicQuantizeLinear) values that float ops"


def _float_model(nodes, inputs, outputs, initializers, opset=17) -> onnx.ModelProto:
    graph = oh.make_graph(nodes, "case", inputs, outputs, [onh.from_array(v, k) for k, v in initializers.items()])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], ir_version=IR_VERSION)


def _optimised(tmp_path: Path, model: onnx.ModelProto) -> onnx.ModelProto:
    onnx.save(model, tmp_path / "source.onnx")
    optimize(tmp_path / "source.onnx", tmp_path / "optimised")
    return onnx.load(tmp_path / "optimised" / "model.onnx")


class _Samples:
    """A CalibrationDataReader over seeded samples."""

    def __init__(self, name: str, shape, count: int = 4):
        self.samples = iter([{name: RNG.normal(size=shape).astype(np.float32)} for _ in range(count)])

    def get_next(self):
        return next(self.samples, None)


def _conv_net() -> onnx.ModelProto:
    """Conv -> Relu -> grouped Conv -> Relu -> Flatten -> MatMul [+ bias]: QLinearConv twice, QLinearMatMul."""
    w1 = RNG.normal(scale=0.3, size=(8, 3, 3, 3)).astype(np.float32)
    w2 = RNG.normal(scale=0.3, size=(8, 4, 3, 3)).astype(np.float32)
    w3 = RNG.normal(scale=0.1, size=(8 * 6 * 6, 10)).astype(np.float32)
    nodes = [oh.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
             oh.make_node("Relu", ["c1"], ["r1"]),
             oh.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], group=2),
             oh.make_node("Relu", ["c2"], ["r2"]),
             oh.make_node("Flatten", ["r2"], ["flat"]), oh.make_node("MatMul", ["flat", "w3"], ["y"])]
    return _float_model(nodes, [oh.make_tensor_value_info("x", F, [1, 3, 12, 12])],
                        [oh.make_tensor_value_info("y", F, [1, 10])],
                        {"w1": w1, "b1": RNG.normal(size=8).astype(np.float32), "w2": w2,
                         "b2": RNG.normal(size=8).astype(np.float32), "w3": w3})


@pytest.mark.parametrize("per_channel", [True, False], ids=["per_channel", "per_tensor"])
def test_qoperator_convolutions_and_matmul_equal_onnxruntime(tmp_path, per_channel):
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    onnx.save(_conv_net(), tmp_path / "float.onnx")
    quantize_static(str(tmp_path / "float.onnx"), str(tmp_path / "q.onnx"), _Samples("x", (1, 3, 12, 12)),
                    quant_format=QuantFormat.QOperator, per_channel=per_channel, reduce_range=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    source = onnx.load(tmp_path / "q.onnx")
    assert {"QLinearConv", "QLinearMatMul"} <= {n.op_type for n in source.graph.node}
    from edgebuild_coreml.interpreter import run_program

    lowered = lower(_optimised(tmp_path, source))
    for seed in range(3):
        x = np.random.default_rng(seed).normal(size=(1, 3, 12, 12)).astype(np.float32)
        got = run_program(lowered.program, {lowered.input_names["x"]: x})[lowered.output_names["y"]]
        np.testing.assert_array_equal(got, run_onnxruntime(source, {"x": x})["y"])


def test_dynamic_matmuls_equal_onnxruntime_and_fp16_says_it_is_not_exact(tmp_path):
    """Two quantize_dynamic MatMuls (MatMulInteger -> Cast -> Mul, bias Add): equal at fp32; at fp16 the
    lowering notes that quantised arithmetic is approximate there."""
    from onnxruntime.quantization import quantize_dynamic

    w1, w2 = (RNG.normal(size=s).astype(np.float32) for s in ((64, 48), (48, 16)))
    model = _float_model([oh.make_node("MatMul", ["x", "w1"], ["h"]), oh.make_node("Add", ["h", "b"], ["hb"]),
                          oh.make_node("MatMul", ["hb", "w2"], ["y"])],
                         [oh.make_tensor_value_info("x", F, [4, 64])], [oh.make_tensor_value_info("y", F, [4, 16])],
                         {"w1": w1, "w2": w2, "b": RNG.normal(size=48).astype(np.float32)})
    onnx.save(model, tmp_path / "float.onnx")
    quantize_dynamic(tmp_path / "float.onnx", tmp_path / "q.onnx", reduce_range=True)
    source = onnx.load(tmp_path / "q.onnx")
    optimised = _optimised(tmp_path, source)
    x = (RNG.normal(size=(4, 64)) * 4).astype(np.float32)
    np.testing.assert_array_equal(lower_and_run(optimised, {"x": x})["y"], run_onnxruntime(source, {"x": x})["y"])
    assert not any(FP16_NOTE in note for note in lower(optimised, precision="float32").notes)
    assert any(FP16_NOTE in note for note in lower(optimised, precision="float16").notes)
    fp16 = lower_and_run(optimised, {"x": x}, precision="float16")["y"]
    assert np.isfinite(fp16).all()


# -- real architectures (slow) ------------------------------------------------------------------

def _run(recipe: Path, cache: Path, workdir: Path, variant: str) -> dict:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    done = subprocess.run([sys.executable, "-m", "edgebuild.cli.app", "run", str(recipe), "--variant", variant,
                           "--cache-dir", str(cache), "--json"], capture_output=True, text=True, cwd=workdir,
                          env=env, timeout=1800, check=False)
    assert done.stdout.strip(), f"no JSON on stdout (exit {done.returncode}):\n{done.stderr[-3000:]}"
    [record] = json.loads(done.stdout)["variants"]
    assert record["status"] == "built", f"{recipe.name} {variant}: {record.get('error')}\n{done.stderr[-3000:]}"
    return record


def _worst_cosine(record: dict) -> float:
    metrics = record["validation"]["runtimes"]["interpreter"]["metrics"]
    return min(values["cosine"]["min"] for values in metrics.values() if "cosine" in values)


def _report_notes(record: dict) -> list[str]:
    return json.loads(Path(record["report"]).with_name("report.json").read_text()).get("notes", [])


def _recipe(workdir: Path, model: Path, inputs: dict, cosine: float, *, extends: str | None = None) -> Path:
    body = {"validate": {"samples": 4, "thresholds": {"cosine_min": cosine, "max_rel_max": None}},
            "variants": {"fp32": {"target": {"precision": "float32"}},
                         "fp16": {"target": {"precision": "float16"},
                                  "validate": {"thresholds": {"cosine_min": 0.9, "max_rel_max": None}}}},
            "outputs": {"dir": "out"}}
    if extends:
        import hashlib

        sha256 = hashlib.sha256(model.read_bytes()).hexdigest()
        head = {"extends": extends, "name": model.stem, "source": {"model": str(model), "sha256": sha256}}
        # the shipped fp32 variant's elementwise limit is for its float source
        body["variants"]["fp32"]["validate"] = {"per_output": {name: {"thresholds": {"max_rel_max": None}}
                                                               for name in ("last_hidden_state", "pooler_output")}}
    else:
        head = {"edgebuild": 1, "name": model.stem, "source": {"model": str(model), "inputs": inputs},
                "target": {"backend": "coreml", "deployment_target": "iOS17", "precision": "float32"}}
    path = workdir / f"{model.stem}.yaml"
    path.write_text(json.dumps({**head, **body}))
    return path


@pytest.fixture(scope="module")
def resnet18_onnx(tmp_path_factory) -> Path:
    import torch
    from edgebuild_testplugin.torchvision_models import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    path = tmp_path_factory.mktemp("resnet18") / "resnet18.onnx"
    torch.onnx.export(model, (torch.rand(1, 3, 112, 112),), str(path), input_names=["x"], output_names=["logits"],
                      dynamo=False, opset_version=17)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("per_channel", [True, False], ids=["per_channel", "per_tensor"])
def test_resnet18_qoperator_matches_onnxruntimes_integer_kernels(resnet18_onnx, tmp_path, per_channel):
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared, quantised = tmp_path / "prepared.onnx", tmp_path / f"resnet18_qoperator_{int(per_channel)}.onnx"
    quant_pre_process(str(resnet18_onnx), str(prepared), skip_symbolic_shape=True)
    samples = _Samples("x", (1, 3, 112, 112), 8)
    samples.samples = iter([{"x": np.random.default_rng(i).uniform(0, 1, (1, 3, 112, 112)).astype(np.float32)}
                            for i in range(8)])
    quantize_static(str(prepared), str(quantised), samples, quant_format=QuantFormat.QOperator,
                    per_channel=per_channel, reduce_range=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    recipe = _recipe(tmp_path, quantised, {"x": {"shape": [1, 3, 112, 112], "dtype": "float32"}}, RESNET_COSINE)
    fp32 = _run(recipe, tmp_path / "cache", tmp_path, "fp32")
    fp16 = _run(recipe, tmp_path / "cache", tmp_path, "fp16")
    print(f"\nresnet18 QOperator per_channel={per_channel}: fp32 cosine {_worst_cosine(fp32):.6f}, "
          f"fp16 {_worst_cosine(fp16):.6f}")
    assert _worst_cosine(fp32) >= RESNET_COSINE
    assert not any(FP16_NOTE in note for note in _report_notes(fp32))
    assert not any(RUNTIME_QUANT_NOTE in note for note in _report_notes(fp32))
    assert any(FP16_NOTE in note for note in _report_notes(fp16))


@pytest.fixture(scope="module")
def minilm_l6(tmp_path_factory) -> Path:
    return _minilm_l6_onnx(tmp_path_factory.mktemp("minilm-l6"))


def _ort_outputs(path: Path, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in feeds.items() if k in names})


@pytest.mark.slow
@pytest.mark.parametrize("reduce_range", [True, False], ids=["7bit", "8bit"])
def test_minilm_l6_dynamic_decomposes_bit_for_bit(minilm_l6, tmp_path, reduce_range):
    from onnxruntime.quantization import quantize_dynamic

    from edgebuild.graph.fusion import PASSES

    quantised = tmp_path / f"minilm_l6_dynamic_{int(reduce_range)}.onnx"
    quantize_dynamic(minilm_l6, quantised, reduce_range=reduce_range)
    # the quantised decomposition alone (the fusions make edgebuild ops onnxruntime cannot run)
    optimize(quantised, tmp_path / "decomposed", passes={name: False for name in PASSES})
    tokens = np.random.default_rng(0).integers(1000, 30000, (1, 128))
    tokens[0, 0], tokens[0, -1] = 101, 102
    feeds = {"input_ids": tokens, "attention_mask": np.ones((1, 128), np.int64),
             "token_type_ids": np.zeros((1, 128), np.int64)}
    for got, expected in zip(_ort_outputs(tmp_path / "decomposed" / "model.onnx", feeds), _ort_outputs(quantised, feeds)):
        np.testing.assert_array_equal(got, expected)
    record = _run(_recipe(tmp_path, quantised, {}, MINILM_L6_COSINE, extends=str(ROOT / "recipes" / "minilm_int8.yaml")),
                  tmp_path / "cache", tmp_path, "fp32")
    print(f"\nMiniLM-L6 dynamic reduce_range={reduce_range}: fp32 cosine {_worst_cosine(record):.6f}")
    assert _worst_cosine(record) >= MINILM_L6_COSINE
    assert any(RUNTIME_QUANT_NOTE in note for note in _report_notes(record))
