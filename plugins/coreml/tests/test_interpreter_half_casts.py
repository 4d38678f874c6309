"""onnxruntime's fp16 <-> fp32 casts (``half_casts``) give numpy's casts bit for bit, in the
input's layout, as arrays of numpy's own that later ops may overwrite."""

from __future__ import annotations

import numpy as np
import pytest
from edgebuild_coreml.interpreter import half_casts, torch_kernels

pytest.importorskip("onnxruntime")


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)  # NaN payloads may differ
    unsigned = np.uint16 if want.dtype == np.float16 else np.uint32
    np.testing.assert_array_equal(got[~nan].view(unsigned), want[~nan].view(unsigned))


def test_every_half_float_widens_as_numpy_widens_it():
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    _same_bits(half_casts.cast(halves, np.dtype(np.float32)), halves.astype(np.float32))


def test_floats_round_to_half_as_numpy_rounds_them():
    rng = np.random.default_rng(3)
    edges = [0x33000000, 0x38000000 - (1 << 16), 0x477FE000, 0x7F7FF000]  # subnormal, smallest normal, fp16 max, inf
    bits = np.concatenate([rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32),
                           *(np.arange(edge, edge + (1 << 17), dtype=np.uint32) for edge in edges)])
    floats = np.concatenate([bits, bits | np.uint32(1 << 31)]).view(np.float32)
    with np.errstate(over="ignore"):
        want = floats.astype(np.float16)
    _same_bits(half_casts.cast(floats, np.dtype(np.float16)), want)


def test_a_channels_last_array_keeps_its_layout_and_the_result_is_its_own():
    value = np.random.default_rng(1).standard_normal((2, 32, 24, 16)).astype(np.float32)
    last = np.ascontiguousarray(value.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    got = half_casts.cast(last, np.dtype(np.float16))
    assert got.strides == np.empty_like(last, np.float16).strides
    assert got.base is None and got.flags.writeable
    _same_bits(got, value.astype(np.float16))


def test_small_strided_and_other_casts_are_left_to_numpy():
    big = np.ones((4, 4096), np.float32)
    assert half_casts.cast(big[:, ::2], np.dtype(np.float16)) is None  # neither C order nor channels last
    assert half_casts.cast(np.ones(16, np.float32), np.dtype(np.float16)) is None
    assert half_casts.cast(big, np.dtype(np.float64)) is None
    np.testing.assert_array_equal(torch_kernels.cast(big[:, ::2], np.float16), big[:, ::2].astype(np.float16))
