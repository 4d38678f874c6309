"""Helpers for the com.microsoft op tests: a case is an ONNX model run by onnxruntime and by the
path ``edgebuild conformance`` takes (conformance_runner.run_onnx_case: iOS18, float32, the
installed plugins' lowerings, the MIL interpreter), compared output by output.

Float outputs must reach cosine >= 0.9999 and stay within a max-abs bound (relative to the
output's largest magnitude when that exceeds 1); integer outputs must match exactly.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx_cases import feeds_of, run_onnxruntime, single_node_model

MS = "com.microsoft"
COSINE_MIN = 0.9999


def contrib_model(op_type: str, inputs: Mapping[str, np.ndarray | None], *, outputs=1, attrs=None,
                  initializers: Sequence[str] = (), domain: str = MS) -> onnx.ModelProto:
    """A one-node model of a com.microsoft op (ONNX opset 17 beside it); an output named ""
    is an optional output left out."""
    model = single_node_model(op_type, inputs, outputs=outputs, attrs=attrs, initializers=initializers, opset=17,
                              domain=domain)
    kept = [o for o in model.graph.output if o.name]
    del model.graph.output[:]
    model.graph.output.extend(kept)
    return model


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    denominator = np.linalg.norm(a) * np.linalg.norm(b)
    return 1.0 if denominator == 0 and not a.any() and not b.any() else float(a @ b / denominator)


def assert_close(actual: np.ndarray, expected: np.ndarray, *, max_abs: float, name: str = "") -> None:
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    if expected.dtype.kind in "biu":
        np.testing.assert_array_equal(actual.astype(np.int64), expected.astype(np.int64), err_msg=name)
        return
    assert np.isfinite(actual).all(), f"{name}: non-finite values"
    assert cosine(actual, expected) >= COSINE_MIN, f"{name}: cosine {cosine(actual, expected)}"
    if not expected.size:
        return
    error = float(np.max(np.abs(actual.astype(np.float64) - expected)))
    bound = max_abs * max(1.0, float(np.max(np.abs(expected))))
    assert error <= bound, f"{name}: max abs error {error} > {bound}"


def run_like_conformance(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's outputs as ``edgebuild conformance`` computes them, keyed by output name."""
    from edgebuild_coreml.conformance_runner import run_onnx_case

    initializers = {t.name for t in model.graph.initializer}
    order = [v.name for v in model.graph.input if v.name not in initializers]
    produced = run_onnx_case(model, [feeds[name] for name in order])
    return dict(zip([o.name for o in model.graph.output], produced))


def check_with_onnxruntime(model: onnx.ModelProto, inputs: Mapping[str, np.ndarray | None], *,
                           initializers: Sequence[str] = (), max_abs: float = 1e-4) -> dict[str, np.ndarray]:
    """Run ``model`` both ways on ``inputs`` and compare every output; returns ours."""
    feeds = feeds_of(inputs, initializers)
    expected = run_onnxruntime(model, feeds)
    actual = run_like_conformance(model, feeds)
    for name, reference in expected.items():
        assert_close(actual[name], reference, max_abs=max_abs, name=name)
    return actual
