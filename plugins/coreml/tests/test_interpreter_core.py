"""MIL interpreter core: executor, control flow, elementwise/reduce/tensor/constexpr ops.

Programs are built with coremltools' Builder, converted and saved as .mlpackage, read back
and interpreted; results are compared with numpy written independently of the evaluators.
"""

from __future__ import annotations

import numpy as np
import pytest

ct = pytest.importorskip("coremltools")
from coremltools.converters.mil import Builder as mb  # noqa: E402
from coremltools.converters.mil.mil import types  # noqa: E402

from edgebuild.errors import BuildError  # noqa: E402
from edgebuild_coreml.interpreter import load_mlpackage, run_mlpackage, run_program  # noqa: E402
from edgebuild_coreml.interpreter.registry import EVALUATORS  # noqa: E402

FP32 = ct.precision.FLOAT32
FP16 = ct.precision.FLOAT16
RNG = np.random.default_rng(0)


def saved(prog, path, *, precision=FP32, target=ct.target.iOS17):
    model = ct.convert(
        prog,
        convert_to="mlprogram",
        minimum_deployment_target=target,
        compute_precision=precision,
        skip_model_load=True,
    )
    model.save(str(path))
    return path


def roundtrip(prog, tmp_path, inputs, **kwargs):
    fp16 = kwargs.pop("fp16", False)
    return run_mlpackage(saved(prog, tmp_path / "m.mlpackage", **kwargs), inputs, fp16=fp16)


def spec(shape, dtype=types.fp32):
    return mb.TensorSpec(shape=shape, dtype=dtype)


# --------------------------------------------------------------------------- elementwise

BINARY_REFERENCE = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "real_div": np.divide,
    "floor_div": lambda a, b: np.floor(a / b),
    "mod": lambda a, b: a - np.floor(a / b) * b,
    "pow": lambda a, b: np.abs(a) ** b,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "equal": np.equal,
    "not_equal": np.not_equal,
    "less": np.less,
    "less_equal": np.less_equal,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
}
A = np.round(RNG.uniform(-3, 3, (3, 4)), 1).astype(np.float32)
B = np.round(RNG.uniform(0.5, 2, (1, 4)), 1).astype(np.float32)
A[0, :2] = B[0, :2]  # some equal pairs for the comparisons


@pytest.fixture(scope="module")
def binary_outputs(tmp_path_factory):
    @mb.program(input_specs=[spec((3, 4)), spec((1, 4))], opset_version=ct.target.iOS17)
    def prog(a, b):
        outs = []
        for name in BINARY_REFERENCE:
            lhs = mb.abs(x=a) if name == "pow" else a
            outs.append(mb.identity(x=getattr(mb, name)(x=lhs, y=b), name=f"out_{name}"))
        return tuple(outs)

    return roundtrip(prog, tmp_path_factory.mktemp("bin"), {"a": A, "b": B})


@pytest.mark.parametrize("name", list(BINARY_REFERENCE))
def test_binary_op_matches_numpy(binary_outputs, name):
    expected = BINARY_REFERENCE[name](A.astype(np.float64), B.astype(np.float64))
    got = binary_outputs[f"out_{name}"]
    assert got.shape == (3, 4)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_logical_and_int_binary_ops(tmp_path):
    p = RNG.integers(0, 2, (2, 5)).astype(bool)
    q = RNG.integers(0, 2, (2, 5)).astype(bool)
    i = np.array([[7, -7, 8, -8, 0]] * 2, np.int32)
    j = np.array([[2, 2, -3, -3, 5]] * 2, np.int32)

    @mb.program(
        input_specs=[spec((2, 5), types.bool), spec((2, 5), types.bool),
                     spec((2, 5), types.int32), spec((2, 5), types.int32)],
        opset_version=ct.target.iOS17,
    )
    def prog(p, q, i, j):
        return (
            mb.logical_and(x=p, y=q, name="and_"), mb.logical_or(x=p, y=q, name="or_"),
            mb.logical_xor(x=p, y=q, name="xor_"), mb.logical_not(x=p, name="not_"),
            mb.floor_div(x=i, y=j, name="fdiv"), mb.mod(x=i, y=j, name="mod_"),
        )

    out = roundtrip(prog, tmp_path, {"p": p, "q": q, "i": i, "j": j})
    np.testing.assert_array_equal(out["and_"], p & q)
    np.testing.assert_array_equal(out["or_"], p | q)
    np.testing.assert_array_equal(out["xor_"], p ^ q)
    np.testing.assert_array_equal(out["not_"], ~p)
    # Python semantics: floor division, remainder takes the divisor's sign.
    np.testing.assert_array_equal(out["fdiv"][0], [7 // 2, -7 // 2, 8 // -3, -8 // -3, 0])
    np.testing.assert_array_equal(out["mod_"][0], [7 % 2, -7 % 2, 8 % -3, -8 % -3, 0])
    assert out["fdiv"].dtype == np.int32


UNARY_REFERENCE = {
    "abs": (np.abs, (-3, 3)),
    "acos": (np.arccos, (-0.9, 0.9)),
    "asin": (np.arcsin, (-0.9, 0.9)),
    "atan": (np.arctan, (-3, 3)),
    "atanh": (np.arctanh, (-0.9, 0.9)),
    "ceil": (np.ceil, (-3, 3)),
    "cos": (np.cos, (-3, 3)),
    "cosh": (np.cosh, (-3, 3)),
    "erf": (None, (-2, 2)),
    "exp": (np.exp, (-3, 3)),
    "exp2": (np.exp2, (-3, 3)),
    "floor": (np.floor, (-3, 3)),
    "sign": (np.sign, (-3, 3)),
    "sin": (np.sin, (-3, 3)),
    "sinh": (np.sinh, (-3, 3)),
    "sqrt": (np.sqrt, (0.1, 4)),
    "square": (np.square, (-3, 3)),
    "tan": (np.tan, (-1.2, 1.2)),
    "tanh": (np.tanh, (-3, 3)),
    "inverse": (lambda v: 1.0 / (v + 1e-4), (0.5, 3)),
    "log": (lambda v: np.log(v + 1e-45), (0.1, 4)),
    "rsqrt": (lambda v: 1.0 / np.sqrt(v + 1e-12), (0.1, 4)),
}


def _erf_reference(v):
    import math

    return np.array([math.erf(float(t)) for t in v.ravel()]).reshape(v.shape)


@pytest.fixture(scope="module")
def unary_case(tmp_path_factory):
    samples = {n: RNG.uniform(lo, hi, (2, 6)).astype(np.float32) for n, (_, (lo, hi)) in UNARY_REFERENCE.items()}
    names = list(UNARY_REFERENCE)

    @mb.program(input_specs=[spec((len(names), 2, 6))], opset_version=ct.target.iOS17)
    def prog(xs):
        rows = [mb.gather(x=xs, indices=k, axis=0) for k in range(len(names))]
        return tuple(mb.identity(x=getattr(mb, n)(x=v), name=f"out_{n}") for n, v in zip(names, rows))

    inputs = {"xs": np.stack([samples[n] for n in names])}
    return samples, roundtrip(prog, tmp_path_factory.mktemp("un"), inputs)


@pytest.mark.parametrize("name", list(UNARY_REFERENCE))
def test_unary_op_matches_numpy(unary_case, name):
    samples, outputs = unary_case
    fn = UNARY_REFERENCE[name][0] or _erf_reference
    np.testing.assert_allclose(outputs[f"out_{name}"], fn(samples[name].astype(np.float64)), rtol=2e-6, atol=2e-6)


def test_round_clip_threshold_cast(tmp_path):
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.7, -2.7], np.float32)

    @mb.program(input_specs=[spec((8,))], opset_version=ct.target.iOS17)
    def prog(x):
        return (
            mb.round(x=x, name="rounded"),
            mb.clip(x=x, alpha=-1.0, beta=2.0, name="clipped"),
            mb.threshold(x=x, alpha=0.5, name="thresholded"),
            mb.cast(x=x, dtype="int32", name="as_int"),
            mb.cast(x=x, dtype="bool", name="as_bool"),
        )

    out = roundtrip(prog, tmp_path, {"x": x})
    np.testing.assert_array_equal(out["rounded"], [-2, -2, -0, 0, 2, 2, 3, -3])  # half to even
    np.testing.assert_array_equal(out["clipped"], np.minimum(np.maximum(x, -1), 2))
    np.testing.assert_array_equal(out["thresholded"], np.where(x < 0.5, 0.5, x))
    np.testing.assert_array_equal(out["as_int"], [-2, -1, 0, 0, 1, 2, 2, -2])
    assert out["as_int"].dtype == np.int32
    np.testing.assert_array_equal(out["as_bool"], x != 0)


# ------------------------------------------------------------------------------ reduce

X3 = RNG.uniform(0.2, 2.0, (2, 3, 4)).astype(np.float32)
REDUCE_REFERENCE = {
    "reduce_sum": lambda v, a, k: v.sum(axis=a, keepdims=k),
    "reduce_mean": lambda v, a, k: v.mean(axis=a, keepdims=k),
    "reduce_prod": lambda v, a, k: v.prod(axis=a, keepdims=k),
    "reduce_max": lambda v, a, k: v.max(axis=a, keepdims=k),
    "reduce_min": lambda v, a, k: v.min(axis=a, keepdims=k),
    "reduce_sum_square": lambda v, a, k: (v * v).sum(axis=a, keepdims=k),
    "reduce_l1_norm": lambda v, a, k: np.abs(v).sum(axis=a, keepdims=k),
    "reduce_l2_norm": lambda v, a, k: np.sqrt((v * v).sum(axis=a, keepdims=k)),
    "reduce_log_sum": lambda v, a, k: np.log(v.sum(axis=a, keepdims=k)),
    "reduce_log_sum_exp": lambda v, a, k: np.log(np.exp(v).sum(axis=a, keepdims=k)),
}


@pytest.fixture(scope="module")
def reduce_outputs(tmp_path_factory):
    @mb.program(input_specs=[spec((2, 3, 4))], opset_version=ct.target.iOS17)
    def prog(x):
        outs = []
        for name in REDUCE_REFERENCE:
            op = getattr(mb, name)
            outs.append(op(x=x, axes=[1], keep_dims=False, name=f"{name}_ax1"))
            outs.append(op(x=x, axes=[0, -1], keep_dims=True, name=f"{name}_keep"))
            outs.append(op(x=x, name=f"{name}_all"))
        outs.append(mb.reduce_argmax(x=x, axis=1, name="argmax"))
        outs.append(mb.reduce_argmin(x=x, axis=-1, keep_dims=True, name="argmin"))
        return tuple(outs)

    return roundtrip(prog, tmp_path_factory.mktemp("red"), {"x": X3})


@pytest.mark.parametrize("name", list(REDUCE_REFERENCE))
def test_reduction_matches_numpy(reduce_outputs, name):
    v = X3.astype(np.float64)
    ref = REDUCE_REFERENCE[name]
    np.testing.assert_allclose(reduce_outputs[f"{name}_ax1"], ref(v, 1, False), rtol=1e-5)
    np.testing.assert_allclose(reduce_outputs[f"{name}_keep"], ref(v, (0, 2), True), rtol=1e-5)
    np.testing.assert_allclose(reduce_outputs[f"{name}_all"], ref(v, None, False), rtol=1e-5)


def test_argmax_argmin(reduce_outputs):
    np.testing.assert_array_equal(reduce_outputs["argmax"], X3.argmax(axis=1))
    np.testing.assert_array_equal(reduce_outputs["argmin"], X3.argmin(axis=-1)[..., None])
    assert reduce_outputs["argmax"].dtype == np.int32


# ------------------------------------------------------------------------ tensor ops


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


def test_list_ops_inside_a_loop():
    @mb.program(input_specs=[spec((3, 2))], opset_version=ct.target.iOS17)
    def prog(x):
        ls = mb.make_list(init_length=3, elem_shape=[2], dtype="fp32", dynamic_length=True)

        def cond(i, ls):
            return mb.less(x=i, y=3)

        def body(i, ls):
            row = mb.gather(x=x, indices=i, axis=0)
            return mb.add(x=i, y=1), mb.list_write(ls=ls, index=i, value=mb.mul(x=row, y=10.0))

        _, ls = mb.while_loop(_cond=cond, _body=body, loop_vars=(0, ls))
        return (
            mb.list_gather(ls=ls, indices=[2, 0], name="gathered"),
            mb.list_read(ls=ls, index=1, name="read"),
            mb.list_length(ls=ls, name="length"),
        )

    x = RNG.standard_normal((3, 2)).astype(np.float32)
    o = run_program(prog, {"x": x})
    np.testing.assert_allclose(o["gathered"], 10 * x[[2, 0]], rtol=1e-6)
    np.testing.assert_allclose(o["read"], 10 * x[1], rtol=1e-6)
    assert int(o["length"]) == 3


# ------------------------------------------------------------------------ control flow


def test_cond_takes_each_branch(tmp_path):
    @mb.program(input_specs=[spec((3,))], opset_version=ct.target.iOS17)
    def prog(x):
        positive = mb.greater(x=mb.reduce_sum(x=x), y=0.0)
        return mb.cond(
            pred=positive,
            _true_fn=lambda: mb.mul(x=x, y=2.0),
            _false_fn=lambda: mb.sub(x=x, y=100.0),
            name="chosen",
        )

    path = saved(prog, tmp_path / "cond.mlpackage")
    up = np.array([1.0, 2.0, -0.5], np.float32)
    down = -up
    (out_up,) = run_mlpackage(path, {"x": up}).values()
    (out_down,) = run_mlpackage(path, {"x": down}).values()
    np.testing.assert_array_equal(out_up, up * 2)
    np.testing.assert_array_equal(out_down, down - 100)


def test_while_loop_runs_until_condition_fails(tmp_path):
    @mb.program(input_specs=[spec((4,)), spec((1,), types.int32)], opset_version=ct.target.iOS17)
    def prog(x, n):
        limit = mb.squeeze(x=n)

        def cond(i, acc):
            return mb.less(x=i, y=limit)

        def body(i, acc):
            return mb.add(x=i, y=1), mb.add(x=mb.mul(x=acc, y=2.0), y=1.0)

        i, acc = mb.while_loop(_cond=cond, _body=body, loop_vars=(0, x))
        return mb.identity(x=acc, name="acc"), mb.identity(x=i, name="count")

    x = np.array([0, 1, 2, 3], np.float32)
    o = roundtrip(prog, tmp_path, {"x": x, "n": np.array([5], np.int32)})
    expected = x.copy()
    for _ in range(5):
        expected = expected * 2 + 1
    np.testing.assert_array_equal(o["acc"], expected)
    assert int(o["count"]) == 5


# -------------------------------------------------------------------- precision, errors


def test_fp16_program_rounds_like_fp16(tmp_path):
    x = RNG.uniform(-4, 4, (64,)).astype(np.float32)
    y = RNG.uniform(-4, 4, (64,)).astype(np.float32)

    @mb.program(input_specs=[spec((64,)), spec((64,))], opset_version=ct.target.iOS17)
    def prog(x, y):
        return mb.mul(x=mb.add(x=x, y=y), y=x, name="out")

    path = saved(prog, tmp_path / "h.mlpackage", precision=FP16)
    assert any(op.op_type == "cast" for op in load_mlpackage(path).functions["main"].operations)
    out = run_mlpackage(path, {"x": x, "y": y})["out"]
    h = np.float16
    expected = ((x.astype(h) + y.astype(h)) * x.astype(h)).astype(np.float32)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, expected)
    assert not np.array_equal(out, (x + y) * x)  # fp16 rounding is really visible


def test_fp16_flag_emulates_half_precision_on_fp32_program(tmp_path):
    x = RNG.uniform(-4, 4, (64,)).astype(np.float32)

    @mb.program(input_specs=[spec((64,))], opset_version=ct.target.iOS17)
    def prog(x):
        return mb.mul(x=mb.exp(x=x), y=3.0, name="out")

    path = saved(prog, tmp_path / "f.mlpackage")
    exact = run_mlpackage(path, {"x": x})["out"]
    halved = run_mlpackage(path, {"x": x}, fp16=True)["out"]
    np.testing.assert_allclose(exact, np.exp(x) * 3, rtol=1e-6)
    h = np.float16
    expected = (np.exp(x.astype(h).astype(np.float32)).astype(h).astype(np.float32) * 3).astype(h).astype(np.float32)
    np.testing.assert_array_equal(halved, expected)


def test_inputs_cast_to_declared_dtype_and_checked():
    @mb.program(input_specs=[spec((2,), types.int32)], opset_version=ct.target.iOS17)
    def prog(x):
        return mb.add(x=x, y=1, name="out")

    out = run_program(prog, {"x": np.array([1.0, 2.0])})["out"]
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, [2, 3])
    with pytest.raises(BuildError, match="shape"):
        run_program(prog, {"x": np.zeros(3)})
    with pytest.raises(BuildError, match="'x'"):
        run_program(prog, {})


def test_missing_evaluator_names_op_type_and_op(monkeypatch):
    @mb.program(input_specs=[spec((2,))], opset_version=ct.target.iOS17)
    def prog(x):
        return mb.exp(x=x, name="the_exp")

    run_program(prog, {"x": np.zeros(2, np.float32)})  # loads evaluators
    monkeypatch.setattr(EVALUATORS.entry("exp"), "obj", None)
    with pytest.raises(BuildError, match=r"'exp'.*'the_exp'"):
        run_program(prog, {"x": np.zeros(2, np.float32)})


def test_evaluator_failure_is_a_build_error_naming_the_op():
    @mb.program(input_specs=[spec((3,)), spec((1,), types.int32)], opset_version=ct.target.iOS17)
    def prog(x, i):
        never_written = mb.make_list(init_length=2, elem_shape=["s"], dtype="fp32")
        return mb.list_read(ls=never_written, index=mb.squeeze(x=i), name="bad_read")

    with pytest.raises(BuildError, match="bad_read"):
        run_program(prog, {"x": np.zeros(3, np.float32), "i": np.array([0], np.int32)})


# ------------------------------------------------------------------ compressed weights

W = RNG.standard_normal((64, 48)).astype(np.float32)


def _weight_program():
    @mb.program(input_specs=[spec((64, 48))], opset_version=ct.target.iOS17)
    def prog(x):
        return mb.mul(x=x, y=W, name="out")

    return prog


def _compressed_package(tmp_path, compress, target):
    model = ct.convert(
        _weight_program(), convert_to="mlprogram", minimum_deployment_target=target,
        compute_precision=FP32, skip_model_load=True,
    )
    compressed = compress(model)
    path = tmp_path / "c.mlpackage"
    compressed.save(str(path))
    op_types = {op.op_type for op in load_mlpackage(path).functions["main"].operations}
    dense = run_mlpackage(path, {"x": np.ones((64, 48), np.float32)})["out"]
    return op_types, dense


@pytest.mark.parametrize("target", [ct.target.iOS17, ct.target.iOS18])
def test_int8_linear_quantized_weights(tmp_path, target):
    from coremltools.optimize import coreml as cto

    config = cto.OptimizationConfig(
        global_config=cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int8", granularity="per_channel")
    )
    op_types, dense = _compressed_package(tmp_path, lambda m: cto.linear_quantize_weights(m, config), target)
    expected_op = "constexpr_affine_dequantize" if target == ct.target.iOS17 else "constexpr_blockwise_shift_scale"
    assert expected_op in op_types
    # Symmetric int8: every weight within half a step of its channel's scale.
    scale = np.abs(W).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(dense - W) <= scale / 2 + 1e-6)
    assert not np.array_equal(dense, W)


@pytest.mark.parametrize("target", [ct.target.iOS17, ct.target.iOS18])
def test_palettized_weights(tmp_path, target):
    from coremltools.optimize import coreml as cto

    config = cto.OptimizationConfig(global_config=cto.OpPalettizerConfig(mode="uniform", nbits=4))
    op_types, dense = _compressed_package(tmp_path, lambda m: cto.palettize_weights(m, config), target)
    assert "constexpr_lut_to_dense" in op_types
    assert len(np.unique(dense)) <= 16
    # Uniform 4-bit LUT over [min, max]: each weight within half a step of a palette entry.
    step = (W.max() - W.min()) / 15
    assert np.max(np.abs(dense - W)) <= step / 2 + 1e-5


@pytest.mark.parametrize("target", [ct.target.iOS17, ct.target.iOS18])
def test_pruned_weights(tmp_path, target):
    from coremltools.optimize import coreml as cto

    config = cto.OptimizationConfig(global_config=cto.OpMagnitudePrunerConfig(target_sparsity=0.5))
    op_types, dense = _compressed_package(tmp_path, lambda m: cto.prune_weights(m, config), target)
    assert "constexpr_sparse_to_dense" in op_types
    kept = dense != 0
    assert abs(kept.mean() - 0.5) < 0.01
    np.testing.assert_array_equal(dense[kept], W[kept])
    # Magnitude pruning keeps the large weights.
    assert np.abs(W[kept]).min() >= np.abs(W[~kept]).max()


def test_joint_sparse_palettized_weights_ios18(tmp_path):
    from coremltools.optimize import coreml as cto

    def compress(model):
        pruned = cto.prune_weights(model, cto.OptimizationConfig(global_config=cto.OpMagnitudePrunerConfig(target_sparsity=0.5)))
        config = cto.OptimizationConfig(global_config=cto.OpPalettizerConfig(mode="uniform", nbits=4))
        return cto.palettize_weights(pruned, config, joint_compression=True)

    op_types, dense = _compressed_package(tmp_path, compress, ct.target.iOS18)
    assert "constexpr_lut_to_sparse" in op_types
    kept = dense != 0
    assert abs(kept.mean() - 0.5) < 0.01
    assert len(np.unique(dense[kept])) <= 16
    nonzero = W[kept]
    step = (nonzero.max() - nonzero.min()) / 15
    assert np.max(np.abs(dense[kept] - nonzero)) <= step / 2 + 1e-5


# ---------------------------------------------------------------- iOS17/18 odds and ends


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


def test_state_read_and_update_ios18():
    @mb.program(
        input_specs=[mb.StateTensorSpec((1, 4), dtype=types.fp16), spec((1, 4), types.fp16)],
        opset_version=ct.target.iOS18,
    )
    def prog(cache, x):
        mb.coreml_update_state(state=cache, value=mb.add(x=mb.read_state(input=cache), y=x))
        return mb.mul(x=mb.read_state(input=cache), y=np.float16(2), name="out")

    cache = np.ones((1, 4), np.float16)
    x = np.arange(4, dtype=np.float16).reshape(1, 4)
    np.testing.assert_array_equal(run_program(prog, {"cache": cache, "x": x})["out"], 2 * (cache + x))


def test_values_are_dropped_after_their_last_reader():
    import weakref

    @mb.program(input_specs=[spec((2, 3))])
    def prog(x):
        a = mb.relu(x=x, name="a")
        b = mb.sigmoid(x=a, name="b")
        c = mb.tanh(x=b, name="c")
        return mb.add(x=c, y=b, name="d")  # b stays alive until d reads it

    alive, seen = {}, {}

    def observe(op, outputs):
        seen[op.name] = {name: ref() is not None for name, ref in alive.items()}
        alive[op.name] = weakref.ref(outputs[0])

    x = RNG.standard_normal((2, 3)).astype(np.float32)
    (out,) = run_program(prog, {"x": x}).values()
    np.testing.assert_allclose(out, np.tanh(1 / (1 + np.exp(-np.maximum(x, 0)))) + 1 / (1 + np.exp(-np.maximum(x, 0))),
                               rtol=1e-6)
    run_program(prog, {"x": x}, observer=observe)
    assert seen["c"] == {"a": False, "b": True}  # a's last reader (b) has run; b is read again by d
    assert seen["d"] == {"a": False, "b": True, "c": True}


@pytest.mark.parametrize("op", ["sigmoid", "silu"])
def test_sigmoid_family_in_slices_matches_numpy(monkeypatch, op):
    from edgebuild.reference import slices

    monkeypatch.setattr(slices, "SLICE_VALUES", 7)  # slice edges everywhere
    x = (RNG.standard_normal((4, 5, 6)) * 30).astype(np.float32)
    x.reshape(-1)[:4] = [np.nan, np.inf, -np.inf, 0.0]

    @mb.program(input_specs=[spec((4, 5, 6))])
    def prog(x):
        return getattr(mb, op)(x=x)

    (got,) = run_program(prog, {"x": x}).values()
    with np.errstate(invalid="ignore"):
        sigmoid = 1 / (1 + np.exp(-x.astype(np.float64)))
        expected = sigmoid * x if op == "silu" else sigmoid
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-30)  # NaN where expected is NaN


@pytest.mark.parametrize("dtype,axis,scale_dtype", [(np.int8, 0, np.float32), (np.uint8, 1, np.float16), (np.int8, -1, np.float16)])
def test_affine_dequantize_matches_coremltools(dtype, axis, scale_dtype):
    from coremltools.converters.mil.mil.ops.defs.iOS16.constexpr_ops import constexpr_affine_dequantize

    from edgebuild_coreml.interpreter.ops_constexpr import affine_dequantize

    info = np.iinfo(dtype)
    data = RNG.integers(info.min, info.max + 1, size=(6, 5)).astype(dtype)
    channels = data.shape[axis]
    zero_point = RNG.integers(info.min, info.max + 1, size=channels).astype(dtype)
    scale = (RNG.random(channels) * 0.1 + 0.01).astype(scale_dtype)
    args = {"quantized_data": data, "zero_point": zero_point, "scale": scale, "axis": axis}
    got = affine_dequantize(None, args)
    expected = constexpr_affine_dequantize.decompress(data, zero_point, scale, axis)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def _three_dequantized_matmuls():
    weights = [RNG.integers(-128, 128, size=(32, 32)).astype(np.int8) for _ in range(3)]  # 4 KB dense

    @mb.program(input_specs=[spec((2, 32))], opset_version=ct.target.iOS16)
    def prog(x):
        dense = [mb.constexpr_affine_dequantize(quantized_data=w, zero_point=np.int8(0), scale=np.float32(0.5),
                                                axis=0) for w in weights]
        for d in dense:
            x = mb.matmul(x=x, y=d)
        return x

    x = RNG.standard_normal((2, 32)).astype(np.float32)
    expected = x
    for w in weights:
        expected = expected @ (w.astype(np.float32) * 0.5)
    return prog, x, expected


def _tracking_expansions(patch) -> list:
    """Weak references to every array the dequantize evaluator makes, in order."""
    import weakref

    prog, x, _ = _three_dequantized_matmuls()
    run_program(prog, {"x": x})  # loads the evaluators
    made: list = []
    expand = EVALUATORS["constexpr_affine_dequantize"]

    def tracking(op, x):
        result = expand(op, x)
        made.append((weakref.ref(result), sum(ref() is not None for ref, _ in made)))
        return result

    patch.setattr(EVALUATORS.entry("constexpr_affine_dequantize"), "obj", tracking)
    return made


def test_compressed_weights_are_expanded_only_while_read_when_not_cached():
    """Decompression ops stand at the top of a program: all expanded up front, every weight of
    the model would be dense at once."""
    from edgebuild_coreml.interpreter import plan

    prog, x, expected = _three_dequantized_matmuls()
    with pytest.MonkeyPatch.context() as patch:
        made = _tracking_expansions(patch)
        patch.setattr(plan, "EXPANDED_CACHE_BYTES", 0)
        for _ in range(2):
            (got,) = run_program(prog, {"x": x}).values()
            np.testing.assert_allclose(got, expected, rtol=1e-5)
    live_at_expansion = [live for _, live in made]
    assert live_at_expansion == [0] * 6  # each dropped before the next is made, on every run
    assert all(ref() is None for ref, _ in made)


def test_expanded_weights_are_cached_across_runs_up_to_the_cap():
    from edgebuild_coreml.interpreter import plan

    prog, x, expected = _three_dequantized_matmuls()
    with pytest.MonkeyPatch.context() as patch:
        made = _tracking_expansions(patch)
        patch.setattr(plan, "EXPANDED_CACHE_BYTES", 32 * 32 * 4)  # room for one float32 [32, 32] weight
        for _ in range(3):
            (got,) = run_program(prog, {"x": x}).values()
            np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert len(made) == 3 + 2 + 2  # the first weight is expanded once, the other two on every run
    assert sum(ref() is not None for ref, _ in made) == 1
    plan.forget_plans(prog)
    assert all(ref() is None for ref, _ in made)


def test_in_place_ops_never_overwrite_a_value_read_later():
    """Elementwise ops write into an input only when nothing else can see it: not a function
    input or output, not a value a later op reads, not the base of a live view."""
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)

    @mb.program(input_specs=[spec((2, 3, 4))], opset_version=ct.target.iOS17)
    def prog(x):
        first = mb.relu(x=x)  # x is the caller's array
        shifted = mb.add(x=first, y=np.float32(1.0))  # an output, read again below
        view = mb.reshape(x=shifted, shape=[6, 4])  # shares shifted's memory
        scaled = mb.mul(x=shifted, y=np.float32(2.0))  # shifted dead here, but view is alive
        clipped = mb.clip(x=scaled, alpha=np.float32(0.5), beta=np.float32(2.5))  # scaled dead: free
        squashed = mb.sigmoid_hard(x=clipped, alpha=np.float32(0.3), beta=np.float32(0.1))
        flat = mb.reshape(x=squashed, shape=[6, 4])
        return shifted, mb.sub(x=view, y=flat), mb.silu(x=mb.exp(x=flat))

    kept = x.copy()
    shifted, difference, silu = run_program(prog, {"x": x}).values()
    np.testing.assert_array_equal(x, kept)
    want_shifted = np.maximum(kept, 0) + 1
    want_squashed = np.clip(0.3 * np.clip(2 * want_shifted, 0.5, 2.5) + 0.1, 0, 1).reshape(6, 4)
    np.testing.assert_allclose(shifted, want_shifted, rtol=1e-6)
    np.testing.assert_allclose(difference, want_shifted.reshape(6, 4) - want_squashed, rtol=1e-6, atol=1e-6)
    e = np.exp(want_squashed)
    np.testing.assert_allclose(silu, e / (1 + np.exp(-e)), rtol=1e-6)


def test_in_place_ops_write_into_dead_intermediates():
    from edgebuild_coreml.interpreter.registry import INPLACE

    x = RNG.standard_normal((64,)).astype(np.float32)

    @mb.program(input_specs=[spec((64,))], opset_version=ct.target.iOS17)
    def prog(x):
        a = mb.mul(x=x, y=np.float32(3.0))
        b = mb.add(x=a, y=np.float32(1.0))
        return mb.relu(x=b)

    made = []
    with pytest.MonkeyPatch.context() as patch:
        run_program(prog, {"x": x})  # loads the evaluators
        for op_type in ("mul", "add", "relu"):
            assert op_type in INPLACE
            original = EVALUATORS[op_type]

            def tracking(op, args, donated=(), original=original):
                result = original(op, args, donated=donated)
                made.append(result.__array_interface__["data"][0])
                return result

            patch.setattr(EVALUATORS.entry(op_type), "obj", tracking)
        (got,) = run_program(prog, {"x": x}).values()
    np.testing.assert_allclose(got, np.maximum(3 * x + 1, 0), rtol=1e-6)
    assert len(set(made)) == 1  # mul made the buffer; add and relu wrote into it


def test_interpreter_runtime_reads_a_package_once_until_it_changes(tmp_path, monkeypatch):
    from edgebuild_coreml import interpreter
    from edgebuild_coreml.runtime import InterpreterRuntime

    def program(scale):
        @mb.program(input_specs=[spec((2, 3))], opset_version=ct.target.iOS17)
        def prog(x):
            return mb.mul(x=x, y=np.float32(scale))

        return prog

    path = saved(program(2.0), tmp_path / "m.mlpackage")
    loads = []
    load = interpreter.load_mlpackage
    monkeypatch.setattr(interpreter, "load_mlpackage", lambda p: loads.append(p) or load(p))
    runtime, x = InterpreterRuntime(), RNG.standard_normal((2, 3)).astype(np.float32)
    for _ in range(3):
        (got,) = runtime.run(path, {"x": x}).values()
        np.testing.assert_allclose(got, 2 * x, rtol=1e-6)
    assert len(loads) == 1
    import shutil
    import time

    shutil.rmtree(path)
    time.sleep(0.01)  # a distinct modification time even on coarse clocks
    saved(program(3.0), path)
    (got,) = runtime.run(path, {"x": x}).values()
    np.testing.assert_allclose(got, 3 * x, rtol=1e-6)
    assert len(loads) == 2
