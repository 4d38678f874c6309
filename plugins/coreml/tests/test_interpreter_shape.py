"""Data-moving evaluators of the MIL interpreter against numpy: reshape, transpose,
concat/split/stack, squeeze, tile, reverse, reverse_sequence, sliding windows and
space_to_batch/batch_to_space.
"""

from __future__ import annotations

import numpy as np
import pytest

ct = pytest.importorskip("coremltools")
from coremltools.converters.mil import Builder as mb  # noqa: E402
from interpreter_programs import roundtrip, spec  # noqa: E402

from edgebuild_coreml.interpreter import run_program  # noqa: E402

RNG = np.random.default_rng(0)


def test_shape_ops(tmp_path):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    y = RNG.standard_normal((2, 3, 4)).astype(np.float32)

    @mb.program(input_specs=[spec((2, 3, 4)), spec((2, 3, 4))], opset_version=ct.target.iOS17)
    def prog(x, y):
        parts = mb.split(x=x, split_sizes=[1, 3], axis=2, name="parts")
        return (
            mb.reshape(x=x, shape=[0, -1], name="reshaped"),
            mb.reshape(x=x, shape=[1, 0, -1, 0], name="reshaped_ios17"),
            mb.transpose(x=x, perm=[2, 0, 1], name="transposed"),
            mb.concat(values=[x, y], axis=1, name="concat"),
            mb.concat(values=[x, y], axis=1, interleave=True, name="interleaved"),
            mb.identity(x=parts[1], name="split_1"),
            mb.stack(values=[x, y], axis=-1, name="stacked"),
            mb.expand_dims(x=x, axes=[0, -1], name="expanded"),
            mb.squeeze(x=mb.expand_dims(x=x, axes=[1]), axes=[1], name="squeezed"),
            mb.tile(x=x, reps=[1, 2, 1], name="tiled"),
            mb.flatten2d(x=x, axis=-1, name="flat"),
            mb.reverse(x=x, axes=[0, 2], name="reversed"),
            mb.reshape_like(
                x=x, ref_tensors=(y, y), begins=(2, 0), ends=(3, 2), end_masks=(False, False), name="like"
            ),
        )

    o = roundtrip(prog, tmp_path, {"x": x, "y": y})
    # iOS17 reshape: a 0 copies the input dim at the same place counted from the right.
    np.testing.assert_array_equal(o["reshaped"], x.reshape(3, 8))
    np.testing.assert_array_equal(o["reshaped_ios17"], x.reshape(1, 2, 3, 4))
    np.testing.assert_array_equal(o["transposed"], x.transpose(2, 0, 1))
    np.testing.assert_array_equal(o["concat"], np.concatenate([x, y], 1))
    interleaved = np.empty((2, 6, 4), np.float32)
    interleaved[:, 0::2], interleaved[:, 1::2] = x, y
    np.testing.assert_array_equal(o["interleaved"], interleaved)
    np.testing.assert_array_equal(o["split_1"], x[:, :, 1:])
    np.testing.assert_array_equal(o["stacked"], np.stack([x, y], -1))
    np.testing.assert_array_equal(o["expanded"], x[None, ..., None])
    np.testing.assert_array_equal(o["squeezed"], x)
    np.testing.assert_array_equal(o["tiled"], np.concatenate([x, x], 1))
    np.testing.assert_array_equal(o["flat"], x.reshape(6, 4))
    np.testing.assert_array_equal(o["reversed"], x[::-1, :, ::-1])
    np.testing.assert_array_equal(o["like"], x.reshape(4, 2, 3))


def test_sequences_windows_and_blocks():
    # Compared against hand-written loops; run_program on the built program directly.
    x = np.arange(2 * 5 * 3, dtype=np.float32).reshape(2, 5, 3)
    img = np.arange(1 * 2 * 4 * 6, dtype=np.float32).reshape(1, 2, 4, 6)

    @mb.program(input_specs=[spec((2, 5, 3)), spec((1, 2, 4, 6))], opset_version=ct.target.iOS17)
    def prog(x, img):
        s2b = mb.space_to_batch(x=img, block_shape=[2, 3], paddings=[[0, 0], [0, 0]], name="s2b")
        return (
            mb.reverse_sequence(x=x, lengths=np.array([3, 5], np.int32), seq_axis=1, batch_axis=0, name="rs"),
            mb.sliding_windows(x=x, axis=1, size=2, stride=2, name="win"),
            s2b,
            mb.batch_to_space(x=s2b, block_shape=[2, 3], crops=[[0, 0], [0, 0]], name="b2s"),
        )

    o = run_program(prog, {"x": x, "img": img})
    rs = x.copy()
    for b, length in enumerate([3, 5]):
        rs[b, :length] = x[b, :length][::-1]
    np.testing.assert_array_equal(o["rs"], rs)
    np.testing.assert_array_equal(o["win"], np.stack([x[:, 0:2], x[:, 2:4]], axis=1))
    s2b = np.empty((6, 2, 2, 2), np.float32)
    for oh in range(2):
        for ow in range(3):
            s2b[oh * 3 + ow] = img[0, :, oh::2, ow::3]
    np.testing.assert_array_equal(o["s2b"], s2b)
    np.testing.assert_array_equal(o["b2s"], img)
