"""The ONNX node conformance suite run on Core ML through this plugin's case runner: a
CI-sized slice and (slow) the whole suite."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from edgebuild_coreml.conformance_runner import run_onnx_case

from edgebuild.conformance import runner
from edgebuild.conformance.suite import run_suite
from edgebuild.conformance.tables import write_table
from edgebuild.errors import NotRepresentable

RUNNER = "edgebuild_coreml.conformance_runner:run_onnx_case"


# A CI-sized slice: ~40 cases; most of its time is collecting the cases from the onnx wheel
# and starting two workers (about 20 s on an idle 2-core machine).
SLICE = ["Add", "Relu", "Transpose", "Concat", "ReduceSum", "Where"]


@pytest.fixture(scope="module")
def slice_result():
    return run_suite("onnx-node", "coreml", SLICE, jobs=2, runner=RUNNER)


def test_slice_shape_of_result(slice_result):
    assert set(slice_result) == {"cases", "passed", "total", "by_op"}
    assert slice_result["total"] == len(slice_result["cases"]) > 0
    assert {c["op"] for c in slice_result["cases"]} == set(SLICE)
    for case in slice_result["cases"]:
        assert case["status"] in runner.STATUSES
        assert case["status"] == "pass" or case.get("reason")


def test_slice_pass_rates(slice_result):
    for op in SLICE:
        row = slice_result["by_op"][op]
        assert row["supported"], op
        attempted = row["total"] - row["unsupported"]
        assert attempted and row["passed"] / attempted >= 0.95, (op, row)


def test_table_and_json(slice_result, tmp_path):
    path = tmp_path / "conformance.md"
    write_table(slice_result, path, backend="coreml")
    text = path.read_text()
    assert f"{slice_result['passed']} / {slice_result['total']} cases pass" in text
    for op in SLICE:
        assert f"| {op} |" in text
    json.dumps(slice_result)  # the --json output must serialise


def _reduce_sum_model():
    value = oh.make_tensor_value_info
    graph = oh.make_graph([oh.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)], "g",
                          [value("x", onnx.TensorProto.FLOAT, [2, 3]), value("axes", onnx.TensorProto.INT64, [None])],
                          [value("y", onnx.TensorProto.FLOAT, None)])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def test_an_empty_parameter_is_folded_into_the_model():
    """An empty ``axes`` input cannot be a Core ML input, but as a build-time constant it means
    "every axis"."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y,) = run_onnx_case(_reduce_sum_model(), [x, np.zeros(0, np.int64)])
    assert float(y) == pytest.approx(15.0)


def test_an_empty_data_input_is_not_representable():
    with pytest.raises(NotRepresentable, match="empty"):
        run_onnx_case(_reduce_sum_model(), [np.zeros((2, 0), np.float32), np.array([1], np.int64)])


@pytest.mark.slow
def test_whole_suite_passes_at_least_70_percent():
    result = run_suite("onnx-node", "coreml", jobs=2, runner=RUNNER)
    assert result["total"] > 1500
    assert result["passed"] / result["total"] >= 0.70, (result["passed"], result["total"])
