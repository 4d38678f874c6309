"""benchmarks/llm.py --small --json: the smoke run CI does of the decoder benchmark.

The builds are the stateful form users ship (a generate: recipe on the ONNX decoder with its KV
cache, from the pytorch plugin's causal-LM export). Every row is there with its keys; every row that converted has numeric memory ratios; coremltools on
transformers' LlamaForCausalLM is either a failure with its reason or a measured row. No timing
assertions: the machine's load decides those.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[3]
KEYS = {"row", "seconds", "cpu_seconds", "cpu_vs_peer", "process_seconds", "peak_mb", "after_imports_mb", "peak_delta_mb", "memory_ratio",
        "package_mb", "peer", "time_vs_peer", "memory_vs_peer", "time_vs_floor", "cpu_vs_floor", "stages", "stage_cpu", "error", "stage_peaks"}
ROWS = {"edgebuild-onnx-fp16", "edgebuild-onnx-int4", "edgebuild-pytorch-fp16", "coremltools-guide-fp16",
        "coremltools-guide-int4", "coremltools-llama", "io-floor"}


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@pytest.mark.slow
def test_small_benchmark_json_rows(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "llm.py"), "--small", "--json",
                           "--cache-dir", str(tmp_path)], capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["size"] == "small" and result["parameters"] > 0 and result["fp16_weight_mb"] > 0
    rows = {row["row"]: row for row in result["rows"]}
    assert set(rows) == ROWS
    for name, row in rows.items():
        assert set(row) == KEYS, name
        if name == "coremltools-llama" and row["error"]:
            assert row["memory_ratio"] is None
            continue
        assert row["error"] is None, f"{name}: {row['error']}"
        assert _number(row["peak_delta_mb"]) and _number(row["memory_ratio"]), name
        assert _number(row["package_mb"]) and row["package_mb"] > 0, name
        assert _number(row["cpu_seconds"]) and row["cpu_seconds"] > 0, name
    for name in ("edgebuild-onnx-fp16", "edgebuild-onnx-int4", "edgebuild-pytorch-fp16"):
        assert _number(rows[name]["memory_vs_peer"]) and _number(rows[name]["cpu_vs_peer"]), name
        assert all(_number(peak["ratio"]) for peak in rows[name]["stage_peaks"].values()), name
    # the 4-bit packages hold about a quarter of the fp16 bytes
    assert rows["edgebuild-onnx-int4"]["package_mb"] < 0.5 * rows["edgebuild-onnx-fp16"]["package_mb"]
    _assert_stateful_form(tmp_path / "llama-small")


def _assert_stateful_form(source_root: Path) -> None:
    """The ONNX source has the cache as inputs and outputs, and every edgebuild row's recipe is a
    generate: recipe over it (so the benchmark times the stateful build)."""
    import onnx

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import llm
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    graph = onnx.load(str(source_root / "onnx" / "model.onnx"), load_external_data=False).graph
    inputs, outputs = [v.name for v in graph.input], [v.name for v in graph.output]
    assert "past_key_values.0.key" in inputs and "present.0.value" in outputs, (inputs, outputs)
    source = {"onnx/model.onnx": "m.onnx", "pytorch/model.safetensors": "m.safetensors",
              "pytorch/config.json": "config.json"}
    for row in ("edgebuild-onnx-fp16", "edgebuild-onnx-int4", "edgebuild-pytorch-fp16"):
        recipe = json.loads(llm.recipe_text(source, row))
        assert recipe["generate"]["max_context"] == llm.MAX_CONTEXT, row
        assert 1 in recipe["generate"]["query_lengths"], row
        assert "inputs" not in recipe["source"], row
    assert json.loads(llm.recipe_text(source, "edgebuild-pytorch-fp16"))["source"]["options"]["kind"] == "causal_lm"
