"""Compile-time operands on real architectures: folded where the pinned dims decide them, computed
at run time where the data does.

- torchvision's SSDlite (random weights, exported as a user would): its detection head keeps the
  scores above a threshold (NonZero) and takes ``TopK(scores, Min(300, count))``. The count is data,
  so no pin folds ``k``: the head (the graph up to the first two classes' TopK) builds and gives
  onnxruntime's values and indices.
- a 2-layer BERT exported with a dynamic batch axis and built with a flexible batch: its position
  ids slice ``Shape(input_ids)[1]`` (16, static) while the batch dim stays symbolic, a form
  onnxscript's folding leaves; fold_static_values makes the Slice and Range bounds constants, and
  the build validates.

Both export models and run ``edgebuild run``: -m slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

pytestmark = pytest.mark.slow

COSINE = 0.9999


def _run(recipe: dict, workdir: Path) -> tuple[dict, dict]:
    """``edgebuild run --json`` on ``recipe``: (the variant's record, its report.json)."""
    path = workdir / f"{recipe['name']}.yaml"
    path.write_text(json.dumps(recipe))
    done = subprocess.run([sys.executable, "-m", "edgebuild.cli.app", "run", str(path), "--json", "--cache-dir",
                           str(workdir / "cache")], capture_output=True, text=True, cwd=workdir, timeout=1800,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert done.stdout.strip(), done.stderr[-3000:]
    [record] = json.loads(done.stdout)["variants"]
    assert record["status"] == "built", f"{record.get('error')}\n{done.stderr[-3000:]}"
    report = json.loads(Path(record["report_json"]).read_text())
    return record, report


def _min_cosines(record: dict) -> dict[str, float]:
    metrics = record["validation"]["runtimes"]["interpreter"]["metrics"]
    return {name: values["cosine"]["min"] for name, values in metrics.items() if "cosine" in values}


def _recipe(name, model, inputs, validate_inputs, samples=2, **extra):
    return {"edgebuild": 1, "name": name, "source": {"model": str(model), "inputs": inputs},
            "target": {"backend": "coreml", "deployment_target": "iOS17", "precision": "float32"},
            "validate": {"samples": samples, "inputs": validate_inputs, "thresholds": {"cosine_min": COSINE}},
            "outputs": {"dir": "out"}, **extra}


def test_ssdlite_detection_head_takes_topk_of_the_counted_scores(tmp_path):
    import torch
    from edgebuild_testplugin.torchvision_models import torchvision

    torch.manual_seed(0)
    model = torchvision.models.get_model("ssdlite320_mobilenet_v3_large", weights=None, weights_backbone=None).eval()
    full = tmp_path / "ssdlite.onnx"
    torch.onnx.export(model, (torch.rand(1, 3, 320, 320),), str(full), input_names=["images"], opset_version=17,
                      dynamo=False)
    topks = [n for n in onnx.load(str(full), load_external_data=False).graph.node if n.op_type == "TopK"]
    assert len(topks) == 90  # one per class after background
    head = tmp_path / "ssdlite_head.onnx"
    onnx.utils.extract_model(str(full), str(head), ["images"], [*topks[0].output, *topks[1].output])
    record, _ = _run(_recipe("ssdlite_head", head, {"images": {"shape": [1, 3, 320, 320], "dtype": "float32"}},
                             {"images": {"random": {"low": 0.0, "high": 1.0, "seed": 0}}}), tmp_path)
    cosines = _min_cosines(record)
    print(f"\nworst cosine per output: {cosines}")
    assert len(cosines) == 4 and min(cosines.values()) >= COSINE


def test_bert_with_a_flexible_batch_folds_its_position_bounds(tmp_path):
    import torch
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=37, max_position_embeddings=64)
    model = BertForSequenceClassification(config).eval()
    path = tmp_path / "bert.onnx"
    batch = {0: "batch"}
    torch.onnx.export(model, (torch.randint(0, 128, (2, 16)), torch.ones(2, 16, dtype=torch.int64)), str(path),
                      input_names=["input_ids", "attention_mask"], output_names=["logits"],
                      dynamic_axes={"input_ids": batch, "attention_mask": batch, "logits": batch},
                      opset_version=17, dynamo=False)
    flexible = {"shape": [{"range": [1, 4]}, 16], "dtype": "int64"}
    record, report = _run(_recipe(
        "bert_flexible_batch", path, {"input_ids": flexible, "attention_mask": flexible},
        {"input_ids": {"random": {"low": 0, "high": 127, "seed": 0}},
         "attention_mask": {"random": {"low": 1, "high": 2, "seed": 0}}}), tmp_path)
    assert report["optimize"]["rules"]["fold_static_values"] > 0
    cosines = _min_cosines(record)
    print(f"\nworst cosine per output: {cosines}")
    assert min(cosines.values()) >= COSINE
