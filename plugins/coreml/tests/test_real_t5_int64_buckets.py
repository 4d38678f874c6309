"""T5 builds for Core ML although its relative-position buckets compute int64 values int32 cannot hold.

``_relative_position_bucket`` takes ``Log(0) = -inf`` cast to int64 (-2**63) where a query meets its
own key, and ``Min``/``Where`` discard it. Exported with a dynamic sequence axis (as a user exporting
for variable lengths does) and pinned at 64 tokens, the bucket grid (64 x 64) is inside onnxscript's
folding limit but its ``ConstantOfShape`` is not folded: the -2**63 intermediates reach the Core ML
lowering as constants, which refused them ("holds values outside int32"). The
``saturate_discarded_int64`` pass folds them to their in-range result; the build then matches
onnxruntime on the source.

Each model is transformers' own class from T5Config (2 layers, d_model 64) with seeded random weights,
exported with ``torch.onnx.export``; they run under -m slow: the encoder at fp32, then the encoder, UMT5's and
the decoder step (encoder output as an input, no cache) at fp32 and fp16, and without the pass (the
refusal). By default two small graphs show the Core ML side: saturated sentinels lower and match
onnxruntime, and one the analysis cannot clear refuses naming the reader that keeps it.
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
import onnx_ir as ir
import pytest
from onnx_cases import IR_VERSION, check, lower

from edgebuild.registry import get_registry
from edgebuild_coreml.lowering.errors import LoweringError

TOKENS = 64
CONFIG = dict(d_model=64, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4, d_kv=16, vocab_size=256,
              relative_attention_num_buckets=32)


def _export(kind: str, out: Path) -> Path:
    """T5's encoder (or UMT5's), or one T5 decoder step on the encoder's output, exported with dynamic
    sequence axes."""
    pytest.importorskip("transformers")
    from edgebuild_testplugin.torchvision_models import torchvision  # noqa: F401 (its ops before transformers)
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.T5Config(**CONFIG)
    path = out / f"t5_{kind}.onnx"
    if kind in ("encoder", "umt5_encoder"):
        model = (transformers.T5EncoderModel(config) if kind == "encoder" else
                 transformers.UMT5EncoderModel(transformers.UMT5Config(**CONFIG))).eval()
        args, names, outputs = (torch.randint(0, 256, (1, 16)),), ["input_ids"], ["last_hidden_state"]
        axes = {"input_ids": {1: "tokens"}, "last_hidden_state": {1: "tokens"}}
    else:
        full = transformers.T5ForConditionalGeneration(config).eval()

        class DecoderStep(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = full

            def forward(self, decoder_input_ids, encoder_hidden_states):
                return self.model(encoder_outputs=(encoder_hidden_states,), decoder_input_ids=decoder_input_ids,
                                  use_cache=False).logits

        model = DecoderStep()
        args = (torch.randint(0, 256, (1, 8)), torch.randn(1, 16, 64))
        names, outputs = ["decoder_input_ids", "encoder_hidden_states"], ["logits"]
        axes = {"decoder_input_ids": {1: "steps"}, "encoder_hidden_states": {1: "tokens"}, "logits": {1: "steps"}}
    with torch.no_grad():
        torch.onnx.export(model, args, str(path), input_names=names, output_names=outputs, dynamic_axes=axes,
                          opset_version=17, dynamo=False)
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("t5-int64")


def _build(model: Path, inputs: str, tokens: str, variants: str, workdir: Path, cache: Path) -> dict[str, dict]:
    recipe = workdir / f"{model.stem}.yaml"
    recipe.write_text(
        "edgebuild: 1\n"
        f"name: {model.stem}\n"
        f"source: {{model: {json.dumps(str(model))}, inputs: {inputs}}}\n"
        "target: {backend: coreml, deployment_target: iOS17, precision: float32}\n"
        "validate:\n"
        "  samples: 2\n"
        "  inputs: {%s: {tokens: {vocab_size: 256, seed: 0}}}\n"
        "  thresholds: {cosine_min: 0.9999, max_rel_max: null}\n"
        f"variants: {variants}\n"
        "outputs: {dir: out}\n" % tokens)
    done = subprocess.run([sys.executable, "-m", "edgebuild.cli.app", "run", str(recipe), "--cache-dir", str(cache),
                           "--json"], capture_output=True, text=True, cwd=workdir, timeout=1800,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert done.stdout.strip(), f"no JSON on stdout (exit {done.returncode}):\n{done.stderr[-3000:]}"
    return {record["variant"]: record for record in json.loads(done.stdout)["variants"]}


def _check(record: dict, cosine: float) -> float:
    assert record["status"] == "built", record.get("error") or record["validation"]
    metrics = record["validation"]["runtimes"]["interpreter"]["metrics"]
    assert metrics
    worst = min(values["cosine"]["min"] for values in metrics.values())
    assert all(values["nonfinite"]["max"] == 0 for values in metrics.values())
    assert worst >= cosine, metrics
    return worst


def _folds(record: dict) -> int:
    report = json.loads(Path(record["report_json"]).read_text())
    return report["optimize"]["rules"]["saturate_discarded_int64"]


def _after_the_pass(nodes, initializers) -> onnx.ModelProto:
    """A graph on an int64 ``x`` [6] with the optimise stage's pass applied, as the lowering receives it."""
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", onnx.TensorProto.INT64, [6])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.INT64, [6])], initializers)
    model = ir.serde.deserialize_model(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)],
                                                     ir_version=IR_VERSION))
    get_registry().tables["passes"]["saturate_discarded_int64"].obj.apply(model)
    return ir.serde.serialize_model(model)


def test_saturated_sentinels_lower_and_match_onnxruntime():
    """INT64_MIN as Clip's lower bound, INT64_MAX picked away by a Where: saturated, the package
    computes what onnxruntime computes on the source."""
    keep = np.arange(6) % 2 == 0
    nodes = [oh.make_node("Clip", ["x", "lowest", "hundred"], ["clipped"]),
             oh.make_node("Where", ["keep", "clipped", "sentinels"], ["y"])]
    initializers = [onh.from_array(np.array(np.iinfo(np.int64).min), "lowest"),
                    onh.from_array(np.array(100), "hundred"), onh.from_array(keep, "keep"),
                    onh.from_array(np.where(keep, 0, np.iinfo(np.int64).max), "sentinels")]
    # the Where keeps INT64_MAX at odd places in y: those stay, and refuse; Clip's bound is saturated
    model = _after_the_pass(nodes, initializers)
    assert onh.to_array(next(t for t in model.graph.initializer if t.name == "lowest")) == -(2 ** 31)
    with pytest.raises(LoweringError, match=r"'where' \(Where\).*outside int32.*graph output 'y'"):
        lower(_named(model))
    # then Min with 100 clamps them, and they are saturated too
    nodes[1] = oh.make_node("Where", ["keep", "clipped", "sentinels"], ["picked"])
    nodes.append(oh.make_node("Min", ["picked", "hundred"], ["y"]))
    model = _after_the_pass(nodes, initializers)
    assert all(-(2 ** 31) <= onh.to_array(t).min() and onh.to_array(t).max() < 2 ** 31 for t in model.graph.initializer)
    out = check(model, {"x": np.array([-(2 ** 31), -5, 0, 7, 500, 2 ** 31 - 1])})
    assert out["y"].dtype == np.int32 and list(out["y"]) == [-(2 ** 31), 100, 0, 100, 100, 100]


def _named(model: onnx.ModelProto) -> onnx.ModelProto:
    for node in model.graph.node:
        node.name = node.name or node.op_type.lower()
    return model


def test_kept_sentinel_names_the_reader_that_keeps_it():
    """Min(-2**63, x) is -2**63 in the source but -2**31 saturated: the refusal names the Min's output."""
    nodes = [oh.make_node("Min", ["sentinel", "x"], ["y"], name="clamp")]
    model = _after_the_pass(nodes, [onh.from_array(np.array(np.iinfo(np.int64).min), "sentinel")])
    with pytest.raises(LoweringError, match=r"'clamp' \(Min\).*outside int32.*range analysis.*graph output 'y'"):
        lower(model)


FP32 = "{fp32: {}}"
WITH_FP16 = ("{fp32: {}, fp16: {target: {precision: float16}, validate: {thresholds: {cosine_min: 0.999}}}, "
             "without_pass: {optimize: {passes: {saturate_discarded_int64: false}}}}")


@pytest.mark.slow  # ~20 s of CPU (torch, transformers, a build): more than CI's share
def test_t5_encoder_builds_with_its_buckets_folded(exported, tmp_path):
    model = exported / "t5_encoder.onnx"
    if not model.is_file():
        _export("encoder", exported)
    records = _build(model, "{input_ids: {shape: [1, %d], dtype: int64}}" % TOKENS, "input_ids", FP32, tmp_path,
                     exported / "cache")
    worst = _check(records["fp32"], 0.9999)
    print(f"\nT5 encoder fp32 worst cosine {worst}")
    assert _folds(records["fp32"]) >= 1


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["encoder", "decoder_step", "umt5_encoder"])  # UMT5: buckets in every layer
def test_t5_fp32_and_fp16_and_the_refusal_without_the_pass(kind, exported, tmp_path):
    model = exported / f"t5_{kind}.onnx"
    if not model.is_file():
        _export(kind, exported)
    encoder = kind != "decoder_step"
    inputs = ("{input_ids: {shape: [1, %d], dtype: int64}}" % TOKENS if encoder else
              "{decoder_input_ids: {shape: [1, %d], dtype: int64}, encoder_hidden_states: {shape: [1, %d, 64], "
              "dtype: float32}}" % (TOKENS, TOKENS))
    tokens = "input_ids" if encoder else "decoder_input_ids"
    records = _build(model, inputs, tokens, WITH_FP16, tmp_path, exported / "cache")
    worst = {variant: _check(records[variant], cosine) for variant, cosine in (("fp32", 0.9999), ("fp16", 0.999))}
    print(f"\nT5 {kind} worst cosine {worst}")
    refused = records["without_pass"]
    assert refused["status"] == "failed" and "holds values outside int32" in refused["error"], refused.get("error")
