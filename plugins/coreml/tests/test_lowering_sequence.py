"""Sequence op lowerings against onnxruntime: Trilu, CumSum, TopK, ReverseSequence
(lowering/ops/sequence.py). One-node models, lowered and run in edgebuild's MIL interpreter."""

from __future__ import annotations

from onnx_cases import I64, X, op_table_test

# (op, inputs, attrs, initializer names, opset, outputs)
CASES = {
    # ordering and running ops
    "trilu_upper": ("Trilu", {"x": X}, {}, (), 18, 1),
    "trilu_lower_k": ("Trilu", {"x": X, "k": I64(1)}, {"upper": 0}, (), 18, 1),
    "trilu_upper_negative_k": ("Trilu", {"x": X, "k": I64(-1)}, {}, ("k",), 18, 1),
    "cumsum": ("CumSum", {"x": X, "a": I64(1)}, {}, ("a",), 18, 1),
    "cumsum_exclusive_reverse": ("CumSum", {"x": X, "a": I64(-1)}, {"exclusive": 1, "reverse": 1}, ("a",), 18, 1),
    "topk_largest": ("TopK", {"x": X, "k": I64(2)}, {}, ("k",), 18, 2),
    "topk_smallest_axis": ("TopK", {"x": X, "k": I64(1)}, {"largest": 0, "axis": 1}, ("k",), 18, 2),
    "reverse_sequence": ("ReverseSequence", {"x": X, "l": I64(1, 3)}, {"time_axis": 1, "batch_axis": 0}, (), 18, 1),
}


test_matches_onnxruntime = op_table_test(CASES)
