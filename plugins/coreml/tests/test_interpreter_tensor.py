"""Evaluators of the MIL interpreter that make or rearrange values, against numpy: topk,
argsort, select, cumsum, shape, fill, range, one_hot, band_part, non_zero, and the
activation quantize/dequantize pair.
"""

from __future__ import annotations

import numpy as np
import pytest

ct = pytest.importorskip("coremltools")
from coremltools.converters.mil import Builder as mb  # noqa: E402
from coremltools.converters.mil.mil import types  # noqa: E402
from interpreter_programs import roundtrip, spec  # noqa: E402

from edgebuild_coreml.interpreter import run_program  # noqa: E402

RNG = np.random.default_rng(0)


def test_sorting_and_selection(tmp_path):
    x = np.array([[3.0, 1.0, 3.0, 2.0, 0.5], [0.0, -1.0, 4.0, 4.0, 2.0]], np.float32)

    @mb.program(input_specs=[spec((2, 5))], opset_version=ct.target.iOS17)
    def prog(x):
        values, indices = mb.topk(x=x, k=3, axis=-1, name="top")
        low_values, low_indices = mb.topk(x=x, k=2, axis=1, ascending=True, name="low")
        return (
            mb.identity(x=values, name="top_v"), mb.identity(x=indices, name="top_i"),
            mb.identity(x=low_values, name="low_v"), mb.identity(x=low_indices, name="low_i"),
            mb.argsort(x=x, axis=-1, ascending=True, name="order"),
            mb.select(cond=mb.greater(x=x, y=1.0), a=x, b=mb.mul(x=x, y=-1.0), name="selected"),
            mb.cumsum(x=x, axis=1, name="cs"),
            mb.cumsum(x=x, axis=1, exclusive=True, reverse=True, name="cs_rev_excl"),
        )

    o = roundtrip(prog, tmp_path, {"x": x})
    np.testing.assert_array_equal(o["top_i"], [[0, 2, 3], [2, 3, 4]])  # ties: lower index first
    np.testing.assert_array_equal(o["top_v"], [[3, 3, 2], [4, 4, 2]])
    np.testing.assert_array_equal(o["low_i"], [[4, 1], [1, 0]])
    np.testing.assert_array_equal(o["low_v"], [[0.5, 1.0], [-1.0, 0.0]])
    np.testing.assert_array_equal(o["order"], np.argsort(x, axis=-1, kind="stable"))
    np.testing.assert_array_equal(o["selected"], np.where(x > 1, x, -x))
    np.testing.assert_allclose(o["cs"], np.cumsum(x, 1))
    rev_excl = np.array([[x[r, c + 1:].sum() for c in range(5)] for r in range(2)])
    np.testing.assert_allclose(o["cs_rev_excl"], rev_excl)


def test_generators_and_masks(tmp_path):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    x[0, 1, 2] = 0.0
    labels = np.array([[1, 0], [3, 2]], np.int32)

    @mb.program(input_specs=[spec((2, 3, 4)), spec((2, 2), types.int32)], opset_version=ct.target.iOS17)
    def prog(x, labels):
        return (
            mb.shape(x=x, name="shp"),
            mb.fill(shape=mb.shape(x=x), value=2.5, name="filled"),
            mb.fill_like(ref_tensor=x, value=1.0, name="filled_like"),
            mb.range_1d(start=1, end=mb.reduce_sum(x=mb.shape(x=x)), step=3, name="rng"),
            mb.one_hot(indices=labels, one_hot_vector_size=4, axis=1, on_value=5.0, off_value=-1.0, name="hot"),
            mb.band_part(x=x, lower=1, upper=0, name="band"),
            mb.non_zero(x=mb.greater(x=x, y=0.5), name="nz"),
        )

    o = roundtrip(prog, tmp_path, {"x": x, "labels": labels})
    np.testing.assert_array_equal(o["shp"], [2, 3, 4])
    np.testing.assert_array_equal(o["filled"], np.full((2, 3, 4), 2.5))
    np.testing.assert_array_equal(o["filled_like"], np.ones((2, 3, 4)))
    np.testing.assert_array_equal(o["rng"], np.arange(1, 9, 3))
    hot = np.full((2, 4, 2), -1.0)
    for i in range(2):
        for j in range(2):
            hot[i, labels[i, j], j] = 5.0
    np.testing.assert_array_equal(o["hot"], hot)
    band = np.array([[[x[b, m, n] if 0 <= m - n <= 1 else 0 for n in range(4)] for m in range(3)] for b in range(2)])
    np.testing.assert_array_equal(o["band"], band)
    np.testing.assert_array_equal(o["nz"], np.argwhere(x > 0.5))


def test_quantize_dequantize_activations():
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    scale = np.array([0.02, 0.05, 0.1], np.float32)
    zero_point = np.array([3, -2, 0], np.int8)

    @mb.program(input_specs=[spec((2, 3, 4))], opset_version=ct.target.iOS17)
    def prog(x):
        q = mb.quantize(input=x, scale=scale, zero_point=zero_point, axis=1, output_dtype="int8", name="q")
        return q, mb.dequantize(input=q, scale=scale, zero_point=zero_point, axis=1, name="dq")

    o = run_program(prog, {"x": x})
    s, z = scale[None, :, None], zero_point[None, :, None].astype(np.float32)
    q = np.clip(np.round(x / s) + z, -128, 127)
    assert o["q"].dtype == np.int8
    np.testing.assert_array_equal(o["q"], q)
    np.testing.assert_allclose(o["dq"], s * (q - z), rtol=1e-6)
