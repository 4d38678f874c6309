"""The ONNX node conformance suite: judging outputs and classifying cases (its runs on a
backend are that backend's tests)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import pytest

from edgebuild.conformance import cases
from edgebuild.conformance.cases import Case
from edgebuild.conformance.classify import classify
from edgebuild.conformance.compare import compare
from edgebuild.errors import UsageError

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


def test_compare_sub_byte_integers_exactly():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    ref = np.array([7, -8, 3], dtype=ml_dtypes.int4)
    assert compare([np.array([7, -8, 3], np.int32)], [ref], 1e-3, 1e-7)["status"] == "pass"
    assert compare([np.array([7, -8, 3.0004], np.float32)], [ref], 1e-3, 1e-7)["status"] == "fail"


# -- classifying ---------------------------------------------------------------------------
class _NoLowerings:
    def lowering(self, backend, op_type, domain, opset):
        return None


class _AllLowerings:
    def lowering(self, backend, op_type, domain, opset):
        return object()


def _case(elem_type, op="Relu", x=None, y=None) -> Case:
    node = oh.make_node(op, ["x"], ["y"])
    graph = oh.make_graph([node], "g", [oh.make_tensor_value_info("x", elem_type, [2])],
                          [oh.make_tensor_value_info("y", elem_type, [2])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    x = np.zeros(2) if x is None else x
    y = np.zeros(2) if y is None else y
    return Case("test_x", op, model.SerializeToString(), [x], [y], 1e-3, 1e-7)


def test_classify_types_and_missing_lowerings():
    assert classify(_case(onnx.TensorProto.BFLOAT16), _AllLowerings(), "coreml") == "bfloat16 tensors"
    assert classify(_case(onnx.TensorProto.FLOAT8E4M3FN), _AllLowerings(), "coreml") == "float8e4m3fn tensors"
    assert classify(_case(onnx.TensorProto.FLOAT), _NoLowerings(), "coreml") == "no lowering: Relu"
    assert classify(_case(onnx.TensorProto.FLOAT), _AllLowerings(), "coreml") is None


def test_classify_unsigned_and_sub_byte_integers_by_their_values():
    """Integers travel as int32: a uint64 case is held while its values fit int32."""
    small = np.array([1, 7], np.uint64)
    assert classify(_case(onnx.TensorProto.UINT64, x=small, y=small), _AllLowerings(), "coreml") is None
    large = np.array([1, 1 << 40], np.uint64)
    assert classify(_case(onnx.TensorProto.UINT64, x=large, y=small), _AllLowerings(),
                    "coreml") == "integers beyond int32 range"
    assert classify(_case(onnx.TensorProto.INT4), _AllLowerings(), "coreml") is None


def test_classify_leaves_empty_inputs_to_the_backend_but_not_empty_outputs():
    """An empty input may be a parameter the backend folds; no artifact yields an empty output."""
    empty = np.zeros(0, np.float32)
    assert classify(_case(onnx.TensorProto.FLOAT, x=empty), _AllLowerings(), "coreml") is None
    assert classify(_case(onnx.TensorProto.FLOAT, y=empty), _AllLowerings(),
                    "coreml") == "empty (zero-size) tensors"


def test_op_filter_matches_case_insensitively_and_rejects_unknown_ops():
    assert cases._op_filter(["add", "Relu"], {"Add", "Relu", "Sub"}) == {"Add", "Relu"}
    assert cases._op_filter(None, {"Add"}) is None
    with pytest.raises(UsageError, match="NoSuchOp"):
        cases._op_filter(["NoSuchOp"], {"Add"})


def test_unknown_suite_is_a_usage_error():
    with pytest.raises(UsageError, match="onnx-node"):
        cases.collect_cases("no-such-suite")
