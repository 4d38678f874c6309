"""Sequence op lowerings against onnxruntime: Trilu, CumSum, TopK, ReverseSequence (lowering/ops/sequence.py).

Each case is a one-node ONNX model; the lowered MIL program runs in edgebuild's MIL
interpreter and must match onnxruntime's output.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx_cases import check_op

rng = np.random.default_rng(7)
X = rng.standard_normal((2, 3, 4)).astype(np.float32)
I64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731

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


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_onnxruntime(case):
    op, inputs, attrs, initializers, opset, outputs = CASES[case]
    check_op(op, inputs, attrs=attrs, initializers=initializers, opset=opset, outputs=outputs, rtol=1e-5, atol=1e-5)
