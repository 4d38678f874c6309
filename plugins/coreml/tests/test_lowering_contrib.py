"""com.microsoft ops of onnxruntime's transformer optimiser (lowering/ops/contrib_*.py) against
onnxruntime itself: SkipLayerNormalization, SkipSimplifiedLayerNormalization,
SimplifiedLayerNormalization, EmbedLayerNormalization, Gelu, BiasGelu, FastGelu, QuickGelu,
BiasAdd, FusedMatMul and FusedConv, per attribute and optional input/output combination.

The ONNX node tests hold no com.microsoft ops, so the cases follow onnxruntime's contrib-op
schemas (docs/ContribOperators.md); each is one node, lowered and run the way ``edgebuild
conformance`` runs a case (contrib_cases.py), and compared with onnxruntime on the same inputs.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from contrib_cases import assert_close, check_with_onnxruntime, contrib_model, run_like_conformance
from onnx_cases import rand

from edgebuild_coreml.lowering.errors import LoweringError

B, S, H = 2, 5, 16
X = rand(B, S, H, seed=1)
SKIP = rand(B, S, H, seed=2)
GAMMA, BETA, BIAS = rand(H, seed=3), rand(H, seed=4), rand(H, seed=5)


# -- SkipLayerNormalization -----------------------------------------------------------------
SKIP_SHAPES = {"full": SKIP, "broadcast_batch": SKIP[:1], "two_d": SKIP[0]}


@pytest.mark.parametrize("skip", sorted(SKIP_SHAPES))
@pytest.mark.parametrize("beta,bias", [(True, True), (True, False), (False, True), (False, False)])
@pytest.mark.parametrize("outputs", [["y"], ["y", "mean", "inv_std_var", "sum"], ["y", "", "", "sum"]])
def test_skip_layer_normalization(skip, beta, bias, outputs):
    inputs = {"x": X, "skip": SKIP_SHAPES[skip], "gamma": GAMMA, "beta": BETA if beta else None,
              "bias": BIAS if bias else None}
    model = contrib_model("SkipLayerNormalization", inputs, outputs=outputs, attrs={"epsilon": 1e-5},
                          initializers=("gamma", "beta", "bias"))
    check_with_onnxruntime(model, inputs, initializers=("gamma", "beta", "bias"))


def test_skip_layer_normalization_runtime_parameters_and_default_epsilon():
    inputs = {"x": X * 1e-3, "skip": SKIP * 1e-3, "gamma": GAMMA, "beta": BETA, "bias": BIAS * 1e-3}
    model = contrib_model("SkipLayerNormalization", inputs, outputs=["y", "mean", "inv_std_var", "sum"])
    check_with_onnxruntime(model, inputs)


# -- SkipSimplifiedLayerNormalization / SimplifiedLayerNormalization -----------------------
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("outputs", [["y"], ["y", "", "inv_std_var", "sum"]])
@pytest.mark.parametrize("rank", [3, 2])
def test_skip_simplified_layer_normalization(bias, outputs, rank):
    x, skip = (X, SKIP) if rank == 3 else (X.reshape(-1, H), SKIP.reshape(-1, H))
    inputs = {"x": x, "skip": skip, "gamma": GAMMA, "bias": BIAS if bias else None}
    model = contrib_model("SkipSimplifiedLayerNormalization", inputs, outputs=outputs, attrs={"epsilon": 1e-6},
                          initializers=("gamma", "bias"))
    check_with_onnxruntime(model, inputs, initializers=("gamma", "bias"))


def test_skip_simplified_layer_normalization_mean_is_refused():
    inputs = {"x": X, "skip": SKIP, "gamma": GAMMA}
    model = contrib_model("SkipSimplifiedLayerNormalization", inputs, outputs=["y", "mean"], initializers=("gamma",))
    with pytest.raises(LoweringError, match="SkipSimplifiedLayerNormalization.*mean output"):
        run_like_conformance(model, {"x": X, "skip": SKIP})


@pytest.mark.parametrize("axis,scale", [(-1, GAMMA), (2, GAMMA), (1, rand(S, H, seed=6))])
@pytest.mark.parametrize("outputs", [["y"], ["y", "inv_std_var"]])
def test_simplified_layer_normalization(axis, scale, outputs):
    inputs = {"x": X, "scale": scale}
    model = contrib_model("SimplifiedLayerNormalization", inputs, outputs=outputs, attrs={"axis": axis, "epsilon": 1e-6},
                          initializers=("scale",), domain="")
    check_with_onnxruntime(model, inputs, initializers=("scale",))


# -- EmbedLayerNormalization ----------------------------------------------------------------
VOCAB, POSITIONS, SEGMENTS = 50, 12, 3
RNG = np.random.default_rng(0)
IDS = RNG.integers(0, VOCAB, (B, S)).astype(np.int32)
SEGMENT_IDS = RNG.integers(0, SEGMENTS, (B, S)).astype(np.int32)
POSITION_IDS = RNG.integers(0, POSITIONS, (B, S)).astype(np.int32)
# a 2 is not a 1: onnxruntime's mask index counts entries equal to 1
MASK = np.array([[1, 1, 1, 0, 0], [1, 2, 0, 1, 1]], np.int32)
TABLES = {"word": rand(VOCAB, H, seed=7), "position": rand(POSITIONS, H, seed=8), "segment": rand(SEGMENTS, H, seed=9)}
EMBED_CONSTANTS = ("word", "position", "segment", "gamma", "beta")


def _embed_inputs(segments: bool, mask: bool, positions: str | None):
    return {
        "input_ids": IDS, "segment_ids": SEGMENT_IDS if segments else None, "word": TABLES["word"],
        "position": TABLES["position"], "segment": TABLES["segment"] if segments else None, "gamma": GAMMA,
        "beta": BETA, "mask": MASK if mask else None,
        "position_ids": {None: None, "per_row": POSITION_IDS, "shared": POSITION_IDS[:1]}[positions],
    }


@pytest.mark.parametrize("segments", [True, False])
@pytest.mark.parametrize("mask", [True, False])
@pytest.mark.parametrize("positions", [None, "per_row", "shared"])
# onnxruntime's shape inference wants the mask_index output declared, even when unused
@pytest.mark.parametrize("outputs", [["y", "mask_index"], ["y", "mask_index", "embedding_sum"], ["y", "", "embedding_sum"]])
def test_embed_layer_normalization(segments, mask, positions, outputs):
    inputs = _embed_inputs(segments, mask, positions)
    if inputs["position_ids"] is None:  # the trailing optional input is left out, not passed as ""
        del inputs["position_ids"]
    model = contrib_model("EmbedLayerNormalization", inputs, outputs=outputs, attrs={"epsilon": 1e-12},
                          initializers=EMBED_CONSTANTS)
    check_with_onnxruntime(model, inputs, initializers=EMBED_CONSTANTS)


def test_embed_layer_normalization_dynamic_sequence_length():
    """Positions 0..S-1 come from the runtime sequence length when it is not pinned."""
    from onnx_cases import lower

    inputs = _embed_inputs(True, True, None)
    del inputs["position_ids"]
    model = contrib_model("EmbedLayerNormalization", inputs, outputs=["y", "mask_index"], initializers=EMBED_CONSTANTS)
    for value in model.graph.input:
        value.type.tensor_type.shape.dim[1].dim_param = "sequence"
    result = lower(model)
    assert "range_1d" in {op.op_type for op in result.program.functions["main"].operations}
    check_with_onnxruntime(model, inputs, initializers=EMBED_CONSTANTS)


# -- activations ----------------------------------------------------------------------------
@pytest.mark.parametrize("op,inputs,attrs", [
    ("Gelu", {"x": X * 3}, {}),
    ("BiasGelu", {"x": X * 3, "bias": BIAS}, {}),
    ("FastGelu", {"x": X * 3}, {}),
    ("FastGelu", {"x": X * 3, "bias": BIAS}, {}),
    ("QuickGelu", {"x": X * 3}, {}),
    ("QuickGelu", {"x": X * 3}, {"alpha": 1.0}),
    ("QuickGelu", {"x": X * 3}, {"alpha": -0.7}),
], ids=["gelu", "bias_gelu", "fast_gelu", "fast_gelu_bias", "quick_gelu", "quick_gelu_alpha1", "quick_gelu_alpha_neg"])
@pytest.mark.parametrize("constant_bias", [True, False])
def test_activations(op, inputs, attrs, constant_bias):
    initializers = ("bias",) if constant_bias else ()
    model = contrib_model(op, inputs, attrs=attrs, initializers=initializers)
    check_with_onnxruntime(model, inputs, initializers=initializers)


def test_bias_add():
    """onnxruntime has BiasAdd on CUDA only: checked against its schema's formula, X + bias + skip."""
    inputs = {"x": X, "bias": BIAS, "skip": SKIP}
    model = contrib_model("BiasAdd", inputs, initializers=("bias",))
    actual = run_like_conformance(model, {"x": X, "skip": SKIP})["y"]
    assert_close(actual, X + BIAS + SKIP, max_abs=1e-6, name="y")


# -- FusedMatMul ----------------------------------------------------------------------------
def _operand(batch, rows, cols, trans: bool, trans_batch: bool, seed: int) -> np.ndarray:
    """An operand whose op() (transpose, batch transpose) is [*batch, rows, cols]."""
    shape = [*batch, cols, rows] if trans else [*batch, rows, cols]
    if trans_batch:  # op() moves axis 0 to before the last axis: undo that
        shape = [shape[-2], *shape[:-2], shape[-1]]
    return rand(*shape, seed=seed)


@pytest.mark.parametrize("trans_a,trans_b,batch_a,batch_b", list(itertools.product([0, 1], repeat=4)))
@pytest.mark.parametrize("alpha", [1.0, 0.125])
def test_fused_matmul_transposes(trans_a, trans_b, batch_a, batch_b, alpha):
    batch = [2, 3]
    inputs = {"a": _operand(batch, 4, 5, trans_a, batch_a, 1), "b": _operand(batch, 5, 6, trans_b, batch_b, 2)}
    attrs = {"transA": trans_a, "transB": trans_b, "transBatchA": batch_a, "transBatchB": batch_b, "alpha": alpha}
    check_with_onnxruntime(contrib_model("FusedMatMul", inputs, attrs=attrs), inputs)


@pytest.mark.parametrize("a_shape,b_shape", [((3, 4, 5), (5, 6)), ((2, 1, 4, 5), (3, 5, 6)), ((4, 5), (5,)),
                                             ((5,), (2, 5, 6)), ((4, 5), (5, 6))])
@pytest.mark.parametrize("constant_b", [True, False])
@pytest.mark.parametrize("trans_b", [0, 1])
def test_fused_matmul_broadcasting_and_constant_weights(a_shape, b_shape, constant_b, trans_b):
    b = rand(*b_shape, seed=2)
    if trans_b and len(b_shape) == 1:
        pytest.skip("transB on a vector")
    if trans_b:
        b = np.swapaxes(b, -1, -2).copy()
    inputs = {"a": rand(*a_shape, seed=1), "b": b}
    initializers = ("b",) if constant_b else ()
    model = contrib_model("FusedMatMul", inputs, attrs={"transB": trans_b, "alpha": 0.5}, initializers=initializers)
    check_with_onnxruntime(model, inputs, initializers=initializers)


# -- FusedConv ------------------------------------------------------------------------------
ACTIVATIONS = {
    "none": {}, "Relu": {"activation": "Relu"}, "Tanh": {"activation": "Tanh"}, "Sigmoid": {"activation": "Sigmoid"},
    "LeakyRelu": {"activation": "LeakyRelu", "activation_params": [0.2]},
    "Clip": {"activation": "Clip", "activation_params": [-0.5, 0.7]},
    "HardSigmoid": {"activation": "HardSigmoid", "activation_params": [0.3, 0.4]},
    "HardSwish": {"activation": "HardSwish"},
}


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("with_sum", [False, True])
def test_fused_conv_activations(activation, with_sum):
    x, w, b = rand(1, 3, 7, 6, seed=1) * 2, rand(4, 3, 3, 3, seed=2), rand(4, seed=3)
    attrs = {**ACTIVATIONS[activation], "pads": [1, 0, 1, 2], "strides": [1, 2]}
    z = rand(1, 4, 7, 3, seed=4) if with_sum else None
    inputs = {"x": x, "w": w, "b": b, "z": z}
    model = contrib_model("FusedConv", inputs, attrs=attrs, initializers=("w", "b"))
    check_with_onnxruntime(model, inputs, initializers=("w", "b"))


@pytest.mark.parametrize("case", ["conv1d_group", "conv2d_no_bias_same_upper", "conv3d_dilated"])
def test_fused_conv_geometry(case):
    if case == "conv1d_group":
        inputs = {"x": rand(2, 4, 9, seed=1), "w": rand(6, 2, 3, seed=2), "b": rand(6, seed=3)}
        attrs = {"activation": "Relu", "group": 2, "strides": [2]}
    elif case == "conv2d_no_bias_same_upper":
        inputs = {"x": rand(1, 3, 6, 5, seed=1), "w": rand(2, 3, 2, 3, seed=2), "b": None}
        attrs = {"activation": "LeakyRelu", "activation_params": [0.1], "auto_pad": "SAME_UPPER"}
    else:
        inputs = {"x": rand(1, 2, 5, 5, 5, seed=1), "w": rand(3, 2, 2, 2, 2, seed=2), "b": rand(3, seed=3)}
        attrs = {"activation": "Sigmoid", "dilations": [2, 1, 2]}
    model = contrib_model("FusedConv", inputs, attrs=attrs, initializers=("w", "b"))
    check_with_onnxruntime(model, inputs, initializers=("w", "b"))


def test_fused_conv_unknown_activation_is_refused():
    inputs = {"x": rand(1, 3, 5, 5), "w": rand(2, 3, 3, 3, seed=2)}
    model = contrib_model("FusedConv", inputs, attrs={"activation": "Swish"}, initializers=("w",))
    with pytest.raises(LoweringError, match=r"FusedConv.*'Swish'"):
        run_like_conformance(model, {"x": inputs["x"]})
