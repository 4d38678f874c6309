"""The compression header says what was applied in words, and holds the compressed weights
against the source model's (an fp16 build halves fp32 weights before any compression, so the
ratio against the fp16 weights undersold int8 by half); ``convert --compress`` says the same."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """``convert --compress int8`` of a two-layer fp32 MLP (two 128x128 weights, above the
    compression threshold, and their biases, below it)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    work = tmp_path_factory.mktemp("convert")
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((128, 128)).astype(np.float32) * 0.1, f"w{i}") for i in (0, 1)]
    biases = [numpy_helper.from_array(rng.standard_normal(128).astype(np.float32) * 0.1, f"b{i}") for i in (0, 1)]
    nodes = [helper.make_node("Gemm", ["x", "w0", "b0"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "w1", "b1"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 128])], weights + biases)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), work / "mlp.onnx")
    done = subprocess.run([sys.executable, "-m", "edgebuild.cli.app", "convert", "mlp.onnx", "-o", "Mlp.mlpackage",
                           "--compress", "int8"], cwd=work, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "EDGEBUILD_CACHE_DIR": str(work / "cache")})
    assert done.returncode == 0, done.stderr
    return work, done


def test_the_header_says_what_was_applied_and_the_ratio_against_the_source(converted):
    work, _ = converted
    out = work / "Mlp.edgebuild" / "default"
    report = json.loads((out / "report.json").read_text())
    source = report["import"]["weight_bytes"]
    assert source == 2 * 128 * 128 * 4 + 2 * 128 * 4 and report["import"]["weight_dtypes"] == {"float32": source}
    after, before = report["compression"]["bytes_after"], report["compression"]["bytes_before"]
    assert report["compression"]["applied"] == "int8 linear weights, per-channel"
    html = (out / "report.html").read_text()
    header = re.search(r'<section id="compression"><h2>Compression</h2><p class=sub>(.*?)</p>', html).group(1)
    assert header.startswith("int8 linear weights, per-channel: 2 of 4 weights compressed.")  # the biases are small
    ratio = float(re.search(r"<b>([0-9.]+)× smaller than the source \(fp32\)</b>", header).group(1))
    assert ratio == pytest.approx(source / after, abs=0.01)
    assert 3.5 < ratio < 4.0  # int8 of fp32: a quarter, plus per-channel scales
    fp16 = float(re.search(r"([0-9.]+)× smaller than the uncompressed \(fp16\) weights", header).group(1))
    assert fp16 == pytest.approx(before / after, abs=0.01) and fp16 < 2.0  # what the header used to lead with
    assert f">{ratio:.2f}× smaller than the source<" in html  # the summary card


def test_convert_says_the_ratio_against_the_source(converted):
    work, done = converted
    report = json.loads((work / "Mlp.edgebuild" / "default" / "report.json").read_text())
    ratio = report["import"]["weight_bytes"] / report["compression"]["bytes_after"]
    [line] = [line for line in done.stderr.splitlines() if line.startswith("Mlp.mlpackage")]
    assert f"int8 linear weights, per-channel; weights {ratio:.2f}× smaller than the source (fp32)" in line, line


def test_the_variants_page_holds_the_same_ratio(converted):
    work, _ = converted
    report = json.loads((work / "Mlp.edgebuild" / "default" / "report.json").read_text())
    ratio = report["import"]["weight_bytes"] / report["compression"]["bytes_after"]
    assert f"<td>{ratio:.2f}× vs source</td>" in (work / "Mlp.edgebuild" / "index.html").read_text()
