"""NN op evaluators of the MIL interpreter against onnxruntime and numpy references.

Each case builds a one-op MIL program with coremltools' Builder, runs it through the
interpreter, and compares with a one-node ONNX model run by onnxruntime (an independent
implementation of the same conv/pool/resize/recurrent semantics) or a numpy formula.
"""

from __future__ import annotations

import numpy as np
import pytest

mb = pytest.importorskip("coremltools.converters.mil").Builder
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

from coremltools.converters.mil.mil import Function, Program  # noqa: E402

from edgebuild_coreml.interpreter import run_program  # noqa: E402
from interpreter_programs import spec  # noqa: E402

RNG = np.random.default_rng(7)


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def run_mil(build, opset=None, **inputs):
    """Build a program from ``build(**placeholders)`` and run it; returns the output list."""
    placeholders = {k: mb.placeholder(shape=v.shape) for k, v in inputs.items()}
    prog = Program()
    with Function(placeholders, opset_version=opset) as func:
        outs = build(**func.inputs)
        func.set_outputs(list(outs) if isinstance(outs, (list, tuple)) else [outs])
        prog.add_function("main", func)
    return list(run_program(prog, inputs).values())


def run_onnx(op_type, inputs: dict, n_outputs=1, **attrs):
    node = helper.make_node(op_type, list(inputs), [f"y{i}" for i in range(n_outputs)], **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in inputs.items()],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(n_outputs)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


def onnx_pads(mil_pad):
    """MIL pads (before0, after0, before1, after1) -> ONNX (begins..., ends...)."""
    return list(mil_pad[0::2]) + list(mil_pad[1::2])


# -- convolution -------------------------------------------------------------------------


@pytest.fixture(params=["numpy", "onnxruntime", "torch"])
def conv_kernels(request):
    """Each conv case on the interpreter's own numpy kernels, on onnxruntime's (the validate
    stage's samples in the build's own process) and on torch's (what validation's worker
    processes use where torch is installed)."""
    from edgebuild_coreml.interpreter import ort_kernels, torch_kernels

    if request.param == "numpy":
        yield "numpy"
        return
    if request.param == "onnxruntime":
        with ort_kernels.for_calls():
            yield "onnxruntime"
        return
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    assert torch_kernels.enable(threads=1)
    yield "torch"
    torch_kernels.disable()
    torch.set_num_threads(threads)


@pytest.mark.parametrize(
    "shape, kernel, strides, dilations, pad, groups",
    [
        ((2, 4, 9, 8), (6, 2, 3, 2), [2, 1], [1, 2], [1, 2, 0, 1], 2),
        ((1, 3, 7, 7), (4, 3, 3, 3), [1, 1], [1, 1], [0, 0, 0, 0], 1),
        ((1, 2, 5, 5), (3, 2, 2, 2), [2, 1], [1, 1], [3, 1, 4, 0], 1),  # rows wholly in the padding
        ((1, 4, 10), (4, 1, 3), [2], [3], [2, 1], 4),  # 1-D depthwise
        ((1, 2, 5, 6, 4), (3, 2, 2, 3, 2), [1, 2, 1], [1, 1, 2], [1, 0, 0, 1, 1, 1], 1),  # 3-D
        ((2, 5, 6, 7), (3, 5, 1, 1), [1, 1], [1, 1], [0, 0, 0, 0], 1),  # pointwise: one matmul
        ((1, 5, 7, 6), (4, 5, 1, 1), [2, 3], [1, 1], [0, 0, 0, 0], 1),  # strided pointwise
        ((1, 4, 6, 6), (6, 2, 1, 1), [1, 1], [1, 1], [0, 0, 0, 0], 2),  # grouped pointwise
        ((2, 6, 9, 8), (6, 1, 3, 3), [2, 1], [2, 1], [2, 1, 0, 3], 6),  # 2-D depthwise
        ((1, 3, 7, 7), (6, 1, 3, 3), [1, 2], [1, 1], [1, 1, 1, 1], 3),  # depthwise, 2 outputs per channel
    ],
)
@pytest.mark.parametrize("banded", [False, True], ids=["whole", "row-bands"])
def test_conv_matches_onnxruntime(monkeypatch, conv_kernels, shape, kernel, strides, dilations, pad, groups, banded):
    if banded:  # one output row per matmul, as on large images
        from edgebuild_coreml.interpreter import ops_conv

        monkeypatch.setattr(ops_conv, "TILE_ELEMENTS", 1)
        monkeypatch.setattr(ops_conv, "IM2COL_BAND_ELEMENTS", 1)
    x, w, b = randn(*shape), randn(*kernel), randn(kernel[0])
    (got,) = run_mil(
        lambda x: mb.conv(x=x, weight=w, bias=b, strides=strides, dilations=dilations,
                          pad_type="custom", pad=pad, groups=groups),
        x=x,
    )
    (want,) = run_onnx("Conv", {"x": x, "w": w, "b": b}, strides=strides, dilations=dilations,
                       pads=onnx_pads(pad), group=groups)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def naive_conv(x, w, strides, dilations, pads, groups):
    """Convolution by its definition, one output element at a time, in float64."""
    n, c_in, *size = x.shape
    c_out, c_group, *kernel = w.shape
    padded = np.pad(x.astype(np.float64), [(0, 0), (0, 0), *pads])
    out_sizes = [(s + b + a - (k - 1) * d - 1) // st + 1
                 for s, (b, a), k, d, st in zip(size, pads, kernel, dilations, strides)]
    out = np.zeros((n, c_out, *out_sizes))
    per_group = c_out // groups
    for b_, f, *o in np.ndindex(n, c_out, *out_sizes):
        first = (f // per_group) * c_group
        for c, *k in np.ndindex(c_group, *kernel):
            at = tuple(oi * st + ki * d for oi, ki, st, d in zip(o, k, strides, dilations))
            out[(b_, f, *o)] += padded[(b_, first + c, *at)] * w[(f, c, *k)]
    return out


CONV_CASES = [  # (input shape, weight shape, groups): pointwise, im2col, depthwise, grouped paths
    ((1, 4, 6, 5), (3, 4, 1, 1), 1), ((2, 3, 6, 5), (4, 3, 3, 2), 1), ((1, 4, 6, 5), (4, 1, 3, 3), 4),
    ((1, 4, 6, 5), (8, 1, 2, 3), 4), ((1, 6, 5, 6), (4, 3, 2, 2), 2), ((1, 3, 9), (2, 3, 4), 1),
    ((1, 2, 4, 5, 4), (2, 1, 2, 2, 2), 2),
]


@pytest.mark.parametrize("shape, kernel, groups", CONV_CASES)
@pytest.mark.parametrize("strides, dilations, padded", [(1, 1, False), (2, 1, True), (1, 2, True), (3, 2, False)])
@pytest.mark.parametrize("tile", [1, 1 << 20], ids=["tile-1", "whole"])
@pytest.mark.parametrize("gather", ["taps", "windows"])
def test_conv_matches_its_definition(monkeypatch, conv_kernels, shape, kernel, groups, strides, dilations, padded,
                                     tile, gather):
    from edgebuild_coreml.interpreter import ops_conv

    monkeypatch.setattr(ops_conv, "TILE_ELEMENTS", tile)
    monkeypatch.setattr(ops_conv, "IM2COL_BAND_ELEMENTS", tile)
    monkeypatch.setattr(ops_conv, "IM2COL_TAP_MIN_ELEMENTS", 0 if gather == "taps" else 1 << 62)
    nd = len(shape) - 2
    pads = [(1, 2) if padded else (0, 0)] * nd
    x, w, b = randn(*shape), randn(*kernel), randn(kernel[0])
    (got,) = run_mil(
        lambda x: mb.conv(x=x, weight=w, bias=b, strides=[strides] * nd, dilations=[dilations] * nd,
                          pad_type="custom", pad=[p for pair in pads for p in pair], groups=groups),
        x=x,
    )
    want = naive_conv(x, w, [strides] * nd, [dilations] * nd, pads, groups) + b.reshape((1, -1) + (1,) * nd)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_conv_keeps_its_input_intact():
    """The gathered windows and depthwise taps are copies: the input (maybe a view of a
    constant, or read by a later op) is never written."""
    for kernel, groups in (((4, 4, 3, 3), 1), ((4, 1, 3, 3), 4), ((4, 4, 1, 1), 1)):
        x, w = randn(1, 4, 6, 6), randn(*kernel)
        kept = x.copy()
        run_mil(lambda x: mb.conv(x=x, weight=w, groups=groups), x=x)
        np.testing.assert_array_equal(x, kept)


@pytest.mark.parametrize("pad_type, auto_pad", [("same", "SAME_UPPER"), ("same_lower", "SAME_LOWER")])
def test_conv_same_padding(pad_type, auto_pad):
    x, w = randn(1, 2, 8, 7), randn(3, 2, 4, 3)
    (got,) = run_mil(lambda x: mb.conv(x=x, weight=w, strides=[3, 2], pad_type=pad_type), x=x)
    (want,) = run_onnx("Conv", {"x": x, "w": w}, strides=[3, 2], auto_pad=auto_pad)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv_dynamic_weight():
    x, w = randn(1, 4, 6, 6), randn(2, 4, 3, 3)
    (got,) = run_mil(lambda x, w: mb.conv(x=x, weight=w), x=x, w=w)
    (want,) = run_onnx("Conv", {"x": x, "w": w})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "shape, kernel, strides, dilations, pad, groups",
    [
        ((2, 4, 5, 4), (4, 3, 3, 2), [2, 2], [1, 1], [1, 0, 0, 1], 2),
        ((1, 3, 4, 4), (3, 2, 2, 3), [1, 3], [2, 1], [0, 0, 0, 0], 1),
        ((1, 2, 6), (2, 3, 4), [3], [1], [1, 2], 1),
    ],
)
def test_conv_transpose_matches_onnxruntime(shape, kernel, strides, dilations, pad, groups):
    x, w, b = randn(*shape), randn(*kernel), randn(kernel[1] * groups)
    (got,) = run_mil(
        lambda x: mb.conv_transpose(x=x, weight=w, bias=b, strides=strides, dilations=dilations,
                                    pad_type="custom", pad=pad, groups=groups),
        x=x,
    )
    (want,) = run_onnx("ConvTranspose", {"x": x, "w": w, "b": b}, strides=strides,
                       dilations=dilations, pads=onnx_pads(pad), group=groups)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv_transpose_output_shape_pads_the_end():
    # output_shape one larger than the natural size: ONNX output_padding=1 does the same.
    x, w = randn(1, 2, 4, 4), randn(2, 3, 3, 3)
    (got,) = run_mil(
        lambda x: mb.conv_transpose(x=x, weight=w, strides=[2, 2], pad_type="custom",
                                    pad=[1, 1, 1, 1], output_shape=[1, 3, 8, 8]),
        x=x,
    )
    (want,) = run_onnx("ConvTranspose", {"x": x, "w": w}, strides=[2, 2], pads=[1, 1, 1, 1],
                       output_padding=[1, 1])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# -- pooling -----------------------------------------------------------------------------


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("exclude", [False, True])
@pytest.mark.parametrize("shape, kernel, strides, pad", [
    ((2, 3, 9, 8), [3, 2], [2, 2], [1, 1, 1, 1]),
    ((1, 2, 10, 7), [3, 3], [3, 2], [1, 1, 0, 0]),
])
def test_avg_pool_matches_onnxruntime(shape, kernel, strides, pad, exclude, ceil_mode):
    x = randn(*shape)
    (got,) = run_mil(
        lambda x: mb.avg_pool(x=x, kernel_sizes=kernel, strides=strides, pad_type="custom",
                              pad=pad, exclude_padding_from_average=exclude, ceil_mode=ceil_mode),
        x=x,
    )
    (want,) = run_onnx("AveragePool", {"x": x}, kernel_shape=kernel, strides=strides,
                       pads=onnx_pads(pad), count_include_pad=int(not exclude), ceil_mode=int(ceil_mode))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ceil_mode", [False, True])
def test_max_pool_matches_onnxruntime(conv_kernels, ceil_mode):
    x = randn(2, 3, 10, 9)
    (got,) = run_mil(
        lambda x: mb.max_pool(x=x, kernel_sizes=[3, 2], strides=[2, 2], pad_type="custom",
                              pad=[1, 1, 1, 1], ceil_mode=ceil_mode),
        x=x,
    )
    (want,) = run_onnx("MaxPool", {"x": x}, kernel_shape=[3, 2], strides=[2, 2],
                       pads=[1, 1, 1, 1], ceil_mode=int(ceil_mode))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kernel, pad", [(13, 6), (5, 2)])
def test_max_pool_spp_kernels_match_onnxruntime(kernel, pad):
    """YOLO's SPP pools (stride 1, 'same' padding, kernels up to 13x13 on a 13x13 map), which the
    numpy path takes one spatial dim at a time; a NaN spreads over every window holding it."""
    x = randn(1, 8, 13, 13)
    x[0, 3, 6, 2] = np.nan
    (got,) = run_mil(
        lambda x: mb.max_pool(x=x, kernel_sizes=[kernel, kernel], strides=[1, 1], pad_type="custom",
                              pad=[pad] * 4),
        x=x,
    )
    (want,) = run_onnx("MaxPool", {"x": x}, kernel_shape=[kernel, kernel], strides=[1, 1], pads=[pad] * 4)
    np.testing.assert_array_equal(got[:, [0, 1, 2, 4]], want[:, [0, 1, 2, 4]])
    spread = np.zeros((13, 13), bool)
    spread[max(6 - pad, 0):6 + pad + 1, max(2 - pad, 0):2 + pad + 1] = True
    assert np.array_equal(np.isnan(got[0, 3]), spread)


def test_pool_same_padding_3d_and_l2():
    x, x2d = randn(1, 2, 5, 6, 7), randn(1, 2, 6, 7)
    got_max, got_l2 = run_mil(
        lambda x, x2d: [mb.max_pool(x=x, kernel_sizes=[2, 3, 2], strides=[2, 2, 3], pad_type="same"),
                        mb.l2_pool(x=x2d, kernel_sizes=[3, 2], strides=[2, 3], pad_type="same")],
        x=x, x2d=x2d,
    )
    (want_max,) = run_onnx("MaxPool", {"x": x}, kernel_shape=[2, 3, 2], strides=[2, 2, 3],
                           auto_pad="SAME_UPPER")
    (want_l2,) = run_onnx("LpPool", {"x": x2d}, kernel_shape=[3, 2], strides=[2, 3],
                          auto_pad="SAME_UPPER", p=2)
    np.testing.assert_array_equal(got_max, want_max)
    np.testing.assert_allclose(got_l2, want_l2, rtol=1e-5, atol=1e-5)


# -- normalization, linear, attention --------------------------------------------------------


def test_batch_and_instance_norm():
    x = randn(2, 3, 4, 5)
    mean, var = randn(3), np.abs(randn(3)) + 0.1
    gamma, beta = randn(3), randn(3)
    got_bn, got_in = run_mil(
        lambda x: [mb.batch_norm(x=x, mean=mean, variance=var, gamma=gamma, beta=beta, epsilon=1e-3),
                   mb.instance_norm(x=x, gamma=gamma, beta=beta, epsilon=1e-3)],
        x=x,
    )
    (want_bn,) = run_onnx("BatchNormalization", {"x": x, "s": gamma, "b": beta, "m": mean, "v": var},
                          epsilon=1e-3)
    (want_in,) = run_onnx("InstanceNormalization", {"x": x, "s": gamma, "b": beta}, epsilon=1e-3)
    np.testing.assert_allclose(got_bn, want_bn, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_in, want_in, rtol=1e-4, atol=1e-4)


def test_layer_norm_over_trailing_axes():
    x, gamma, beta = randn(2, 3, 4, 5), randn(4, 5), randn(4, 5)
    (got,) = run_mil(lambda x: mb.layer_norm(x=x, axes=[-2, -1], gamma=gamma, beta=beta), x=x)
    (want,) = run_onnx("LayerNormalization", {"x": x, "g": gamma, "b": beta}, axis=-2, epsilon=1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_local_response_norm_and_l2_norm():
    x = randn(2, 7, 3, 4)
    got_lrn, got_l2 = run_mil(
        lambda x: [mb.local_response_norm(x=x, size=5, alpha=1e-2, beta=0.6, k=2.0),
                   mb.l2_norm(x=x, epsilon=1e-6)],
        x=x,
    )
    (want_lrn,) = run_onnx("LRN", {"x": x}, size=5, alpha=1e-2, beta=0.6, bias=2.0)
    np.testing.assert_allclose(got_lrn, want_lrn, rtol=1e-5, atol=1e-5)
    norms = np.sqrt((x.astype(np.float64) ** 2).sum(axis=(1, 2, 3), keepdims=True) + 1e-6)
    np.testing.assert_allclose(got_l2, x / norms, rtol=1e-5, atol=1e-6)


def test_linear_matmul_einsum():
    x, w, b = randn(2, 3, 5), randn(4, 5), randn(4)
    y, p, q = randn(4, 5), randn(2, 3, 4, 5), randn(2, 5, 4, 6)
    got_lin, got_mm, got_es = run_mil(
        lambda x, y, p, q: [mb.linear(x=x, weight=w, bias=b),
                            mb.matmul(x=x, y=y, transpose_y=True),  # broadcasts over the batch
                            mb.einsum(values=(p, q), equation="nchw,nwhr->nchr")],
        x=x, y=y, p=p, q=q,
    )
    np.testing.assert_allclose(got_lin, x @ w.T + b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_mm, x @ y.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_es, np.einsum("nchw,nwhr->nchr", p, q), rtol=1e-4, atol=1e-4)


def test_scaled_dot_product_attention_with_bool_mask():
    q, k, v = randn(2, 3, 4, 8), randn(2, 3, 6, 8), randn(2, 3, 6, 5)
    mask = RNG.random((4, 6)) > 0.3
    mask[:, 0] = True

    import coremltools as ct

    @mb.program(input_specs=[mb.TensorSpec(q.shape), mb.TensorSpec(k.shape), mb.TensorSpec(v.shape)],
                opset_version=ct.target.iOS18)
    def prog(q, k, v):
        return mb.scaled_dot_product_attention(query=q, key=k, value=v, attn_mask=mask)

    (got,) = run_program(prog, {"q": q, "k": k, "v": v}).values()
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(8)
    scores = np.where(mask, scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    np.testing.assert_allclose(got, weights @ v, rtol=1e-5, atol=1e-5)


# -- activations -------------------------------------------------------------------------


def _sigmoid(v):
    return 1 / (1 + np.exp(-v.astype(np.float64)))


@pytest.mark.parametrize(
    "build, reference",
    [
        (lambda x: mb.relu(x=x), lambda v: np.maximum(v, 0)),
        (lambda x: mb.relu6(x=x), lambda v: np.clip(v, 0, 6)),
        (lambda x: mb.leaky_relu(x=x, alpha=0.1), lambda v: np.where(v >= 0, v, 0.1 * v)),
        (lambda x: mb.elu(x=x, alpha=0.7), lambda v: np.where(v > 0, v, 0.7 * (np.exp(v) - 1))),
        (lambda x: mb.gelu(x=x), lambda v: v * 0.5 * (1 + np.vectorize(__import__("math").erf)(v / np.sqrt(2)))),
        (lambda x: mb.gelu(x=x, mode="TANH_APPROXIMATION"),
         lambda v: 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3)))),
        (lambda x: mb.gelu(x=x, mode="SIGMOID_APPROXIMATION"), lambda v: v * _sigmoid(1.702 * v)),
        (lambda x: mb.sigmoid(x=x), _sigmoid),
        (lambda x: mb.sigmoid_hard(x=x, alpha=0.3, beta=0.4), lambda v: np.clip(0.3 * v + 0.4, 0, 1)),
        (lambda x: mb.silu(x=x), lambda v: v * _sigmoid(v)),
        (lambda x: mb.softplus(x=x), lambda v: np.log1p(np.exp(v))),
        (lambda x: mb.softsign(x=x), lambda v: v / (1 + np.abs(v))),
        (lambda x: mb.scaled_tanh(x=x, alpha=2.0, beta=0.5), lambda v: 2 * np.tanh(0.5 * v)),
        (lambda x: mb.linear_activation(x=x, alpha=2.0, beta=-1.0), lambda v: 2 * v - 1),
        (lambda x: mb.thresholded_relu(x=x, alpha=0.5), lambda v: np.where(v >= 0.5, v, 0)),
        (lambda x: mb.clamped_relu(x=x, alpha=0.2, beta=1.5),
         lambda v: np.minimum(np.where(v >= 0, v, 0.2 * v), 1.5)),
        (lambda x: mb.softmax(x=x, axis=1),
         lambda v: np.exp(v) / np.exp(v).sum(axis=1, keepdims=True)),
    ],
)
def test_activation(build, reference):
    x = randn(2, 3, 4, 5) * 3
    (got,) = run_mil(build, x=x)
    np.testing.assert_allclose(got, reference(x.astype(np.float64)), rtol=1e-5, atol=1e-6)


def test_per_channel_activations():
    x = randn(2, 3, 4, 5)
    alpha, beta = np.array([0.1, 0.5, 2.0], np.float32), np.array([1.0, 2.0, 0.5], np.float32)
    got_prelu, got_softplus = run_mil(
        lambda x: [mb.prelu(x=x, alpha=alpha), mb.softplus_parametric(x=x, alpha=alpha, beta=beta)],
        x=x,
    )
    (want_prelu,) = run_onnx("PRelu", {"x": x, "a": alpha.reshape(3, 1, 1)})
    np.testing.assert_allclose(got_prelu, want_prelu, rtol=1e-6)
    a, b = alpha.reshape(1, 3, 1, 1), beta.reshape(1, 3, 1, 1)
    np.testing.assert_allclose(got_softplus, a * np.log1p(np.exp(b * x)), rtol=1e-5, atol=1e-6)


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


# -- resizing ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode, onnx_mode", [
    ("STRICT_ALIGN_CORNERS", "align_corners"),
    ("UNALIGN_CORNERS", "half_pixel"),
    ("DEFAULT", "asymmetric"),
])
def test_resize_bilinear_matches_onnxruntime(mode, onnx_mode):
    x = randn(1, 2, 5, 4)
    (got,) = run_mil(
        lambda x: mb.resize_bilinear(x=x, target_size_height=8, target_size_width=3, sampling_mode=mode),
        x=x,
    )
    sizes = np.array([1, 2, 8, 3], np.int64)
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y0"], mode="linear",
                            coordinate_transformation_mode=onnx_mode)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y0", TensorProto.FLOAT, None)],
        initializer=[helper.make_tensor("sizes", TensorProto.INT64, [4], sizes)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    (want,) = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_resize_grid_points_follow_the_op_doc():
    # The doc's worked example: Xin = 2 resized to 5 and 6 samples, per sampling mode.
    from edgebuild_coreml.interpreter.ops_resize import sample_positions

    doc = {
        ("UNALIGN_CORNERS", 5): [0.0, 0.1, 0.5, 0.9, 1.0],
        ("ALIGN_CORNERS", 5): [0.0, 0.25, 0.5, 0.75, 1.0],
        ("DEFAULT", 5): [0.0, 0.4, 0.8, 1.0, 1.0],
        ("OFFSET_CORNERS", 5): [0.1, 0.3, 0.5, 0.7, 0.9],
        ("UNALIGN_CORNERS", 6): [0.0, 0.0, 0.33, 0.67, 1.0, 1.0],
        ("DEFAULT", 6): [0.0, 0.33, 0.67, 1.0, 1.0, 1.0],
        ("OFFSET_CORNERS", 6): [0.08, 0.25, 0.42, 0.58, 0.75, 0.92],
    }
    for (mode, n_out), want in doc.items():
        np.testing.assert_allclose(sample_positions(mode, 2, n_out), want, atol=0.005)


def test_upsample_nearest_and_bilinear():
    x = randn(1, 2, 3, 4)
    got_nn, got_bl = run_mil(
        lambda x: [mb.upsample_nearest_neighbor(x=x, scale_factor_height=2, scale_factor_width=3),
                   mb.upsample_bilinear(x=x, scale_factor_height=2, scale_factor_width=2,
                                        align_corners=True)],
        x=x,
    )
    np.testing.assert_array_equal(got_nn, x.repeat(2, axis=2).repeat(3, axis=3))
    (want_bl,) = run_onnx("Resize", {"x": x, "r": np.array([], np.float32),
                                     "s": np.array([1, 1, 2, 2], np.float32)},
                          mode="linear", coordinate_transformation_mode="align_corners")
    np.testing.assert_allclose(got_bl, want_bl, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("padding_mode, onnx_padding", [("constant", "zeros"), ("border", "border")])
def test_resample_matches_grid_sample(padding_mode, onnx_padding):
    x = randn(2, 3, 5, 6)
    grid = (RNG.random((2, 4, 7, 2)) * 2.4 - 1.2).astype(np.float32)
    (got,) = run_mil(
        lambda x, g: mb.resample(x=x, coordinates=g, sampling_mode="bilinear",
                                 padding_mode=padding_mode, padding_value=0.0,
                                 coordinates_mode="normalized_minus_one_to_one", align_corners=False),
        x=x, g=grid,
    )
    (want,) = run_onnx("GridSample", {"x": x, "g": grid}, mode="bilinear", padding_mode=onnx_padding,
                       align_corners=0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_pad_and_space_rearrangements():
    x = randn(1, 8, 4, 6)
    got_reflect, got_d2s, got_s2d, got_shuffle = run_mil(
        lambda x: [mb.pad(x=x, pad=[1, 2, 2, 1], mode="reflect"),
                   mb.depth_to_space(x=x, block_size=2),
                   mb.space_to_depth(x=x, block_size=2),
                   mb.pixel_shuffle(x=x, upscale_factor=2)],
        x=x,
    )
    np.testing.assert_array_equal(got_reflect, np.pad(x, [(0, 0), (0, 0), (1, 2), (2, 1)], "reflect"))
    (want_d2s,) = run_onnx("DepthToSpace", {"x": x}, blocksize=2, mode="DCR")
    (want_s2d,) = run_onnx("SpaceToDepth", {"x": x}, blocksize=2)
    (want_crd,) = run_onnx("DepthToSpace", {"x": x}, blocksize=2, mode="CRD")
    np.testing.assert_array_equal(got_d2s, want_d2s)
    np.testing.assert_array_equal(got_s2d, want_s2d)
    np.testing.assert_array_equal(got_shuffle, want_crd)


# -- recurrent ---------------------------------------------------------------------------


def run_onnx_rnn(op_type, feeds: dict, outputs: list[str], **attrs):
    """A one-node ONNX recurrent model; ``feeds`` in the op's input order ('' = omitted)."""
    node = helper.make_node(op_type, [k if v is not None else "" for k, v in feeds.items()],
                            outputs, **attrs)
    given = {k: v for k, v in feeds.items() if v is not None}
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for k, v in given.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, given)


def _ifoz_from_onnx_iofc(w):
    """ONNX LSTM gate order [i, o, f, c] -> MIL [i, f, o, z(cell)]."""
    i, o, f, c = np.split(w, 4, axis=0)
    return np.concatenate([i, f, o, c], axis=0)


@pytest.mark.parametrize("peepholes", [True, False], ids=["peephole", "no-peephole"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_lstm_matches_onnxruntime(direction, peepholes):
    seq, batch, inp, hidden = 5, 2, 3, 4
    dirs = 2 if direction == "bidirectional" else 1
    x = randn(seq, batch, inp)
    w, r = randn(dirs, 4 * hidden, inp) * 0.5, randn(dirs, 4 * hidden, hidden) * 0.5
    b = randn(dirs, 8 * hidden)
    peep = randn(dirs, 3 * hidden) * 0.3  # ONNX order [i, o, f]
    h0, c0 = randn(dirs, batch, hidden), randn(dirs, batch, hidden)

    def mil_weights(d):
        p_i, p_o, p_f = np.split(peep[d], 3)
        return dict(
            weight_ih=_ifoz_from_onnx_iofc(w[d]),
            weight_hh=_ifoz_from_onnx_iofc(r[d]),
            bias=_ifoz_from_onnx_iofc(b[d, : 4 * hidden] + b[d, 4 * hidden :]),
            **({"peephole": np.concatenate([p_i, p_f, p_o])} if peepholes else {}),
        )

    kwargs = mil_weights(0)
    if dirs == 2:
        kwargs.update({f"{k}_back": v for k, v in mil_weights(1).items()})
    got_seq, got_h, got_c = run_mil(
        lambda x, h, c: mb.lstm(x=x, initial_h=h, initial_c=c, direction=direction,
                                output_sequence=True, **kwargs),
        x=x, h=np.concatenate(list(h0), axis=-1), c=np.concatenate(list(c0), axis=-1),
    )
    feeds = {"x": x, "w": w, "r": r, "b": b, "seq_lens": None, "h0": h0, "c0": c0, "p": peep if peepholes else None}
    want_seq, want_h, want_c = run_onnx_rnn("LSTM", feeds, ["y", "yh", "yc"], hidden_size=hidden,
                                            direction=direction)
    # ONNX Y is [seq, dirs, batch, hidden]; MIL concatenates directions on the last axis.
    np.testing.assert_allclose(got_seq, np.concatenate(list(want_seq.transpose(1, 0, 2, 3)), -1),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got_h, np.concatenate(list(want_h), -1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got_c, np.concatenate(list(want_c), -1), rtol=1e-4, atol=1e-5)


def _roz_from_onnx_zrh(m):
    """ONNX GRU gate order [z, r, h] -> MIL [r, o(new), z]."""
    z, r, h = np.split(m, 3, axis=0)
    return np.concatenate([r, h, z], axis=0)


def test_gru_reset_after_matches_onnxruntime():
    import coremltools as ct

    seq, batch, inp, hidden = 4, 2, 3, 5
    x, h0 = randn(seq, batch, inp), randn(batch, hidden)
    w, r, b = randn(1, 3 * hidden, inp), randn(1, 3 * hidden, hidden), randn(1, 6 * hidden)

    @mb.program(input_specs=[mb.TensorSpec(x.shape), mb.TensorSpec(h0.shape)],
                opset_version=ct.target.iOS18)
    def prog(x, h):
        return mb.gru(x=x, initial_h=h, weight_ih=_roz_from_onnx_zrh(w[0]),
                      weight_hh=_roz_from_onnx_zrh(r[0]), input_bias=_roz_from_onnx_zrh(b[0, : 3 * hidden]),
                      bias=_roz_from_onnx_zrh(b[0, 3 * hidden :]), reset_after=True, output_sequence=True)

    got_seq, got_h = run_program(prog, {"x": x, "h": h0}).values()
    feeds = {"x": x, "w": w, "r": r, "b": b, "seq_lens": None, "h0": h0[None]}
    want_seq, want_h = run_onnx_rnn("GRU", feeds, ["y", "yh"], hidden_size=hidden, linear_before_reset=1)
    np.testing.assert_allclose(got_seq, want_seq[:, 0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got_h, want_h[0], rtol=1e-4, atol=1e-5)


def test_gru_default_resets_hidden_before_the_matmul():
    # reset_after=False (the default): o = tanh(W_o x + R_o (r * h) + b_o), ONNX's default too.
    seq, batch, inp, hidden = 3, 2, 3, 4
    x, h0 = randn(seq, batch, inp), randn(batch, hidden)
    w, r, rb = randn(1, 3 * hidden, inp), randn(1, 3 * hidden, hidden), randn(1, 3 * hidden)
    got_seq, got_h = run_mil(
        lambda x, h: mb.gru(x=x, initial_h=h, weight_ih=_roz_from_onnx_zrh(w[0]),
                            weight_hh=_roz_from_onnx_zrh(r[0]), bias=_roz_from_onnx_zrh(rb[0]),
                            output_sequence=True),
        x=x, h=h0,
    )
    b = np.concatenate([np.zeros_like(rb), rb], axis=-1)
    feeds = {"x": x, "w": w, "r": r, "b": b, "seq_lens": None, "h0": h0[None]}
    want_seq, want_h = run_onnx_rnn("GRU", feeds, ["y", "yh"], hidden_size=hidden)
    np.testing.assert_allclose(got_seq, want_seq[:, 0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got_h, want_h[0], rtol=1e-4, atol=1e-5)


def test_rnn_matches_onnxruntime():
    seq, batch, inp, hidden = 4, 3, 2, 5
    x, h0 = randn(seq, batch, inp), randn(batch, hidden)
    w, r, bias = randn(1, hidden, inp), randn(1, hidden, hidden), randn(1, 2 * hidden)
    got_seq, got_h = run_mil(
        lambda x, h: mb.rnn(x=x, initial_h=h, weight_ih=w[0], weight_hh=r[0],
                            bias=bias[0, :hidden] + bias[0, hidden:], output_sequence=True),
        x=x, h=h0,
    )
    feeds = {"x": x, "w": w, "r": r, "b": bias, "seq_lens": None, "h0": h0[None]}
    want_seq, want_h = run_onnx_rnn("RNN", feeds, ["y", "yh"], hidden_size=hidden)
    np.testing.assert_allclose(got_seq, want_seq[:, 0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got_h, want_h[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("interleave", [False, True])
def test_concat_of_scalars_is_a_vector_as_mil_types_it(interleave):
    """MIL's concat takes 0-d values as one element each along the axis (a shape built from
    scalars, as other converters write one)."""
    from coremltools.converters.mil import Builder as mb

    @mb.program(input_specs=[mb.TensorSpec(shape=(3, 5))])
    def program(x):
        first = mb.reduce_max(x=x, axes=[0, 1], keep_dims=False)
        last = mb.reduce_min(x=x, axes=[0, 1], keep_dims=False)
        return mb.concat(values=[first, last, first], axis=0, interleave=interleave)

    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    (out,) = run_program(program, {"x": x}).values()
    np.testing.assert_allclose(out, [x.max(), x.min(), x.max()])
