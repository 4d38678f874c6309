"""Judging a case's outputs against its expected ones, as onnx's backend test runner does."""

from __future__ import annotations

from typing import Sequence

import numpy as np

# ml_dtypes' integer types narrower than a byte (numpy kind "V"): judged exactly, as integers
_SUB_BYTE_INTEGERS = {"int2", "uint2", "int4", "uint4"}


def compare(actual: Sequence[np.ndarray], expected: Sequence[np.ndarray], rtol: float, atol: float) -> dict:
    """``{"status": "pass"|"fail", "reason"?, "max_abs_err"?}`` as onnx's backend runner judges:
    same count and shapes, integers and booleans equal, floats within ``atol + rtol*|ref|``.
    Integer widths may differ (int32 results for int64 references); NaNs compare equal."""
    if len(actual) != len(expected):
        return {"status": "fail", "reason": f"produced {len(actual)} outputs, expected {len(expected)}"}
    worst = 0.0
    for i, (got, ref) in enumerate(zip(actual, expected)):
        got, ref = np.asarray(got), np.asarray(ref)
        if got.shape != ref.shape:
            return {"status": "fail", "reason": f"output {i}: shape {got.shape} != expected {ref.shape}"}
        if got.dtype.kind not in "biuf":
            return {"status": "fail", "reason": f"output {i}: dtype {got.dtype} where {ref.dtype} is expected"}
        if ref.dtype.kind in "biu" or ref.dtype.name in _SUB_BYTE_INTEGERS:
            if got.dtype.kind == "f":
                return {"status": "fail", "reason": f"output {i}: dtype {got.dtype} where {ref.dtype} is expected"}
            diff = np.abs(got.astype(np.int64) - ref.astype(np.int64))
            err = float(diff.max()) if diff.size else 0.0
            worst = max(worst, err)
            if err:
                return {"status": "fail", "reason": f"output {i}: {int(np.count_nonzero(diff))} of {diff.size} "
                        "values differ", "max_abs_err": worst}
            continue
        got64, ref64 = got.astype(np.float64), ref.astype(np.float64)
        with np.errstate(all="ignore"):
            close = np.isclose(got64, ref64, rtol=rtol, atol=atol, equal_nan=True)
            finite = np.isfinite(got64) & np.isfinite(ref64)
            diff = np.abs(got64 - ref64)[finite]
        if diff.size:
            worst = max(worst, float(diff.max()))
        if not close.all():
            return {"status": "fail", "reason": f"output {i}: {int((~close).sum())} of {close.size} values "
                    f"outside rtol={rtol:g}, atol={atol:g}", "max_abs_err": worst}
    return {"status": "pass", "max_abs_err": worst}
