"""Integer division's edges, where the StableHLO spec defers to the implementation: the graph
computes what XLA, and so JAX, does (x / 0 = -1 or all ones, x % 0 = x, min / -1 = min, min % -1 = 0)."""

import numpy as np
import pytest

from jax_checks import export, jax, run_lowered, run_onnxruntime, to_onnx


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32])
@pytest.mark.parametrize("primitive", ["div", "rem"])
def test_division_by_zero_and_overflow_follow_xla(dtype, primitive):
    info = np.iinfo(dtype)
    top = min(int(info.max), 2**31 - 1)  # values the Core ML lowering's int32 carries
    rng = np.random.default_rng(3)
    a = rng.integers(info.min, top, size=24).astype(dtype)
    b = rng.integers(max(int(info.min), -100), min(top, 100), size=24).astype(dtype)
    a[:4] = [info.min, 0, top, 7]
    b[:6] = [0, 0, 0, 0, 1, 3]
    if info.min:
        a[4], b[4] = info.min, -1  # the one quotient that overflows
    exported = export(getattr(jax.lax, primitive), a, b)
    want = np.asarray(exported.call(a, b))
    model = to_onnx(exported)
    np.testing.assert_array_equal(run_onnxruntime(model, [a, b])[0], want)
    np.testing.assert_array_equal(np.asarray(run_lowered(model, [a, b])[0]).astype(dtype), want)
