"""Kernels that keep their temporaries between calls (``_scratch``) never hand them out: each
result is its own array, and threads running the same op at once do not share buffers."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from edgebuild_coreml.interpreter._scratch import KEPT_BYTES, scratch
from edgebuild_coreml.interpreter.ops_conv import conv

RNG = np.random.default_rng(5)


class _Op:
    """A stand-in for a MIL op: the evaluators read its type and name, and keep caches on it."""

    def __init__(self):
        self.op_type, self.name = "conv", "conv"


def _depthwise_args(x):
    weight = RNG.standard_normal((x.shape[1], 1, 3, 3)).astype(np.float32)
    return {"x": x, "weight": weight, "strides": np.array([1, 1]), "dilations": np.array([1, 1]),
            "groups": np.int32(x.shape[1]), "pad_type": "custom", "pad": np.array([1, 1, 1, 1])}


def _reference(args):
    """The depthwise conv by its definition, in float64."""
    x, w = args["x"].astype(np.float64), args["weight"].astype(np.float64)
    padded = np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)])
    h, width = x.shape[2:]
    return sum(padded[:, :, i:i + h, j:j + width] * w[None, :, 0, i, j, None, None]
               for i in range(3) for j in range(3))


def test_a_result_outlives_the_next_call_of_its_op():
    op, first = _Op(), _depthwise_args(RNG.standard_normal((1, 8, 12, 10)).astype(np.float32))
    got = conv(op, first)
    kept = got.copy()
    conv(op, {**first, "x": RNG.standard_normal((1, 8, 12, 10)).astype(np.float32)})
    np.testing.assert_array_equal(got, kept)
    np.testing.assert_allclose(got, _reference(first), rtol=1e-5, atol=1e-5)


def test_threads_running_one_op_at_once_each_get_their_own_result():
    op = _Op()
    weight = _depthwise_args(np.zeros((1, 16, 20, 20), np.float32))["weight"]
    cases = [{**_depthwise_args(RNG.standard_normal((1, 16, 20, 20)).astype(np.float32)), "weight": weight}
             for _ in range(16)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda args: conv(op, args), cases))
    for got, args in zip(results, cases):
        np.testing.assert_allclose(got, _reference(args), rtol=1e-5, atol=1e-5)


def test_a_buffer_past_the_kept_size_is_a_fresh_array_each_time():
    large = (KEPT_BYTES // 4 + 1,)
    assert not np.shares_memory(scratch("test", large, np.float32), scratch("test", large, np.float32))
    small = scratch("test", (4, 4), np.float64)
    assert small.shape == (4, 4) and small.dtype == np.float64
    assert np.shares_memory(small, scratch("test", (2, 2), np.float64))
