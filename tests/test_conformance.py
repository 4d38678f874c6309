"""The ONNX node conformance suite: judging outputs, classifying cases, a CI-sized slice on
Core ML and (slow) the whole suite."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx.helper as oh
import pytest

from edgebuild.conformance import cases, runner
from edgebuild.conformance.cases import Case
from edgebuild.conformance.classify import classify
from edgebuild.conformance.compare import compare
from edgebuild.conformance.suite import run_suite
from edgebuild.conformance.tables import write_table
from edgebuild.errors import UsageError

RUNNER = "edgebuild_coreml.conformance_runner:run_onnx_case"


# -- judging -------------------------------------------------------------------------------
def test_compare_passes_within_tolerance_and_reports_error():
    ref = np.array([1.0, 2.0, np.nan], dtype=np.float32)
    got = ref + np.float32(5e-4)
    outcome = compare([got], [ref], rtol=1e-3, atol=1e-7)
    assert outcome["status"] == "pass"
    assert outcome["max_abs_err"] == pytest.approx(5e-4, rel=1e-3)


def test_compare_fails_outside_tolerance_shape_and_count():
    ref = np.array([1.0, 2.0], dtype=np.float32)
    assert compare([ref * 1.01], [ref], 1e-3, 1e-7)["status"] == "fail"
    assert "shape" in compare([ref[:1]], [ref], 1e-3, 1e-7)["reason"]
    assert "outputs" in compare([ref, ref], [ref], 1e-3, 1e-7)["reason"]


def test_compare_integers_exact_across_widths():
    ref = np.array([3, -4], dtype=np.int64)
    assert compare([ref.astype(np.int32)], [ref], 1e-3, 1e-7)["status"] == "pass"
    assert compare([np.array([3, -5], np.int32)], [ref], 1e-3, 1e-7)["status"] == "fail"
    assert compare([ref.astype(np.float32)], [ref], 1e-3, 1e-7)["status"] == "fail"  # ints must stay ints


# -- classifying ---------------------------------------------------------------------------
class _NoLowerings:
    def lowering(self, backend, op_type, domain, opset):
        return None


class _AllLowerings:
    def lowering(self, backend, op_type, domain, opset):
        return object()


def _case(elem_type, op="Relu") -> Case:
    node = oh.make_node(op, ["x"], ["y"])
    graph = oh.make_graph([node], "g", [oh.make_tensor_value_info("x", elem_type, [2])],
                          [oh.make_tensor_value_info("y", elem_type, [2])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    return Case("test_x", op, model.SerializeToString(), [np.zeros(2)], [np.zeros(2)], 1e-3, 1e-7)


def test_classify_types_and_missing_lowerings():
    assert classify(_case(onnx.TensorProto.BFLOAT16), _AllLowerings(), "coreml") == "bfloat16 tensors"
    assert classify(_case(onnx.TensorProto.UINT64), _AllLowerings(), "coreml") == "uint64 tensors"
    assert classify(_case(onnx.TensorProto.FLOAT), _NoLowerings(), "coreml") == "no lowering: Relu"
    assert classify(_case(onnx.TensorProto.FLOAT), _AllLowerings(), "coreml") is None


def test_op_filter_matches_case_insensitively_and_rejects_unknown_ops():
    assert cases._op_filter(["add", "Relu"], {"Add", "Relu", "Sub"}) == {"Add", "Relu"}
    assert cases._op_filter(None, {"Add"}) is None
    with pytest.raises(UsageError, match="NoSuchOp"):
        cases._op_filter(["NoSuchOp"], {"Add"})


def test_unknown_suite_is_a_usage_error():
    with pytest.raises(UsageError, match="onnx-node"):
        cases.collect_cases("no-such-suite")


# -- running on Core ML --------------------------------------------------------------------
# A CI-sized slice: ~40 cases; most of its time is collecting the cases from the onnx wheel
# and starting two workers (about 20 s on an idle 2-core machine).
SLICE = ["Add", "Relu", "Transpose", "Concat", "ReduceSum", "Where"]


@pytest.fixture(scope="module")
def slice_result():
    pytest.importorskip("edgebuild_coreml")
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


@pytest.mark.slow
def test_whole_suite_passes_at_least_70_percent():
    pytest.importorskip("edgebuild_coreml")
    result = run_suite("onnx-node", "coreml", jobs=2, runner=RUNNER)
    assert result["total"] > 1500
    assert result["passed"] / result["total"] >= 0.70, (result["passed"], result["total"])
