"""The fp16 guard's activation observer: its one-pass peak and the BLAS pool it runs under."""

from __future__ import annotations

import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb
from threadpoolctl import threadpool_info

from edgebuild_coreml import fp16_guard


@pytest.mark.parametrize("array", [
    np.array([1.0, -70000.0, 3.0], np.float32),
    np.array([-0.5, -2.0], np.float32),  # all negative: the peak is -min
    np.zeros(4, np.float32),
    np.array([np.inf, -1e5, 2.0], np.float32),  # non-finite: the chunked scan decides
    np.array([np.nan, 4.0], np.float32),
    np.full(3, -np.inf, np.float32),
    np.array([[1.0, -6e4]], np.float16),
    np.arange(fp16_guard.SCAN_CHUNK * 2 + 5, dtype=np.float32)[::-3],  # strided, several chunks long
])
def test_activation_peak_matches_the_chunked_scan(array):
    assert fp16_guard._activation_peak(array) == fp16_guard._max_abs(array)


def test_activation_peak_skips_non_float_and_empty_outputs():
    assert fp16_guard._activation_peak(np.arange(3)) is None
    assert fp16_guard._activation_peak(np.zeros((0, 2), np.float32)) is None


def test_guard_runs_on_one_blas_thread_and_restores_the_pool(monkeypatch):
    @mb.program(input_specs=[mb.TensorSpec(shape=(4, 8))])
    def prog(x):
        return mb.matmul(x=x, y=np.full((8, 8), 3e4, np.float32), name="wide")

    def blas_threads() -> set[int]:
        return {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}

    before = blas_threads()
    seen = []
    original = fp16_guard._activation_peak

    def spy(value):
        seen.append(blas_threads())
        return original(value)

    monkeypatch.setattr(fp16_guard, "_activation_peak", spy)
    ranges = fp16_guard.activation_ranges(prog, [{"x": np.ones((4, 8), np.float32)}])
    assert ranges["wide"] == pytest.approx(8 * 3e4)
    assert seen and all(threads == {1} for threads in seen)
    assert blas_threads() == before
