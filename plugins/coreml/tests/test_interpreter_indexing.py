"""Slicing, gather and scatter evaluators of the MIL interpreter against numpy and
hand-written loops.

Programs are built with coremltools' Builder, saved as .mlpackage, read back and interpreted.
"""

from __future__ import annotations

import numpy as np
import pytest

ct = pytest.importorskip("coremltools")
from coremltools.converters.mil import Builder as mb  # noqa: E402
from coremltools.converters.mil.mil import types  # noqa: E402
from interpreter_programs import roundtrip, spec  # noqa: E402

RNG = np.random.default_rng(0)


def test_slicing(tmp_path):
    x = np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6)

    @mb.program(input_specs=[spec((4, 5, 6))], opset_version=ct.target.iOS17)
    def prog(x):
        return (
            mb.slice_by_index(x=x, begin=[1, 0, 5], end=[3, 5, 0], stride=[1, 2, -2], name="strided"),
            mb.slice_by_index(
                x=x, begin=[0, -1, 2], end=[2, 0, 4], begin_mask=[True, False, False],
                end_mask=[False, True, False], squeeze_mask=[False, True, False], name="masked",
            ),
            mb.slice_by_index(
                x=x, begin=[3, 0, 0], end=[0, 5, 6], stride=[-1, 1, 3],
                begin_mask=[True, False, False], end_mask=[True, False, False], name="backwards",
            ),
            mb.slice_by_size(x=x, begin=[1, 2, 0], size=[2, -1, 3], name="by_size"),
        )

    o = roundtrip(prog, tmp_path, {"x": x})
    np.testing.assert_array_equal(o["strided"], x[1:3, 0:5:2, 5:0:-2])
    np.testing.assert_array_equal(o["masked"], x[:2, -1, 2:4])
    np.testing.assert_array_equal(o["backwards"], x[::-1, :, ::3])
    np.testing.assert_array_equal(o["by_size"], x[1:3, 2:, 0:3])


def test_gather_family(tmp_path):
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    idx = np.array([[2, 0], [1, 1]], np.int32)
    along = RNG.integers(0, 4, (3, 2, 5)).astype(np.int32)
    nd = np.array([[[0, 1], [2, 3]], [[1, 0], [0, 0]]], np.int32)
    batch_idx = np.array([[0, 3], [1, 1], [2, 0]], np.int32)

    @mb.program(
        input_specs=[spec((3, 4, 5)), spec((2, 2), types.int32), spec((3, 2, 5), types.int32),
                     spec((2, 2, 2), types.int32), spec((3, 2), types.int32)],
        opset_version=ct.target.iOS17,
    )
    def prog(x, idx, along, nd, batch_idx):
        return (
            mb.gather(x=x, indices=idx, axis=1, name="g"),
            mb.gather(x=x, indices=batch_idx, axis=1, batch_dims=1, name="g_batch"),
            mb.gather_along_axis(x=x, indices=along, axis=1, name="ga"),
            mb.gather_nd(x=x, indices=nd, name="gnd"),
        )

    o = roundtrip(prog, tmp_path, {"x": x, "idx": idx, "along": along, "nd": nd, "batch_idx": batch_idx})
    np.testing.assert_array_equal(o["g"], x[:, idx])
    np.testing.assert_array_equal(o["g_batch"], np.stack([x[b][batch_idx[b]] for b in range(3)]))
    expected_along = np.empty((3, 2, 5), np.float32)
    for i in range(3):
        for j in range(2):
            for k in range(5):
                expected_along[i, j, k] = x[i, along[i, j, k], k]
    np.testing.assert_array_equal(o["ga"], expected_along)
    expected_nd = np.array([[x[tuple(p)] for p in row] for row in nd])
    np.testing.assert_array_equal(o["gnd"], expected_nd)


SCATTER_MODES = {
    "update": lambda old, new: new, "add": np.add, "sub": np.subtract, "mul": np.multiply,
    "div": np.divide, "max": np.maximum, "min": np.minimum,
}
SCATTER_DATA = RNG.uniform(1, 2, (4, 3)).astype(np.float32)
SCATTER_UPDATES = RNG.uniform(1, 2, (2, 3)).astype(np.float32)
SCATTER_INDICES = np.array([3, 1], np.int32)
SCATTER_ALONG = np.array([[0, 2, 1], [3, 0, 1]], np.int32)
SCATTER_ND = np.array([[0, 1], [2, 2]], np.int32)
SCATTER_ND_UPDATES = np.array([5.0, 7.0], np.float32)


@pytest.fixture(scope="module")
def scatter_outputs(tmp_path_factory):
    @mb.program(input_specs=[spec((4, 3)), spec((2, 3)), spec((2,))], opset_version=ct.target.iOS17)
    def prog(data, updates, nd_upd):
        outs = []
        for mode in SCATTER_MODES:
            outs += [
                mb.scatter(data=data, indices=SCATTER_INDICES, updates=updates, axis=0, mode=mode, name=f"s_{mode}"),
                mb.scatter_along_axis(
                    data=data, indices=SCATTER_ALONG, updates=updates, axis=0, mode=mode, name=f"sa_{mode}"
                ),
                mb.scatter_nd(data=data, indices=SCATTER_ND, updates=nd_upd, mode=mode, name=f"snd_{mode}"),
            ]
        return tuple(outs)

    inputs = {"data": SCATTER_DATA, "updates": SCATTER_UPDATES, "nd_upd": SCATTER_ND_UPDATES}
    return roundtrip(prog, tmp_path_factory.mktemp("scatter"), inputs)


@pytest.mark.parametrize("mode", list(SCATTER_MODES))
def test_scatter_family(scatter_outputs, mode):
    combine, o = SCATTER_MODES[mode], scatter_outputs
    expected = SCATTER_DATA.copy()
    for row, target in enumerate(SCATTER_INDICES):
        expected[target] = combine(expected[target], SCATTER_UPDATES[row])
    np.testing.assert_allclose(o[f"s_{mode}"], expected, rtol=1e-6)
    expected = SCATTER_DATA.copy()
    for i in range(2):
        for j in range(3):
            target = SCATTER_ALONG[i, j]
            expected[target, j] = combine(expected[target, j], SCATTER_UPDATES[i, j])
    np.testing.assert_allclose(o[f"sa_{mode}"], expected, rtol=1e-6)
    expected = SCATTER_DATA.copy()
    for (r, c), u in zip(SCATTER_ND, SCATTER_ND_UPDATES):
        expected[r, c] = combine(expected[r, c], u)
    np.testing.assert_allclose(o[f"snd_{mode}"], expected, rtol=1e-6)


def test_slice_update_ios18(tmp_path):
    x = np.zeros((4, 6), np.float32)
    update = np.arange(6, dtype=np.float32).reshape(2, 3)

    @mb.program(input_specs=[spec((4, 6)), spec((2, 3))], opset_version=ct.target.iOS18)
    def prog(x, update):
        return mb.slice_update(x=x, update=update, begin=[1, 0], end=[3, 6], stride=[1, 2], name="updated")

    o = roundtrip(prog, tmp_path, {"x": x, "update": update}, target=ct.target.iOS18)
    expected = x.copy()
    expected[1:3, 0:6:2] = update
    np.testing.assert_array_equal(o["updated"], expected)
