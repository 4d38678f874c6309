"""Each fusion rule fires on a small generated model and keeps its numbers.

The reference is onnxruntime on the original model; the fused model (with ``edgebuild::``
ops) runs in onnx's reference evaluator with the numpy ops from ``fused_reference``.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgebuild.graph import fused_reference
from edgebuild.graph.fusion import PASSES

RNG = np.random.default_rng(0)
F = TensorProto.FLOAT


def const(name: str, array) -> TensorProto:
    """A float32 initializer (tests build float models)."""
    return numpy_helper.from_array(np.asarray(array, dtype=np.float32), name)


def make_model(nodes, inputs, outputs, initializers=(), opset=13) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def vi(name: str, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def run_ort(model: onnx.ModelProto, feeds):
    options = ort.SessionOptions()
    # ORT would otherwise rewrite DequantizeLinear -> MatMul into an int8 kernel of its own.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def fuse(model: onnx.ModelProto, pass_name: str) -> tuple[ir.Model, int]:
    """Apply one pass, after shape inference as the optimise stage does."""
    ir_model = ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(model))
    fired = PASSES[pass_name].apply(ir_model)
    return ir_model, fired


def op_types(model: ir.Model) -> list[str]:
    return [n.op_type for n in model.graph]


def assert_same(original: onnx.ModelProto, fused: ir.Model, feeds, atol=1e-5, rtol=1e-4):
    """ORT on the original vs the fused model (ORT too when it holds only standard ops)."""
    expected = run_ort(original, feeds)
    if any(n.domain == "edgebuild" for n in fused.graph):
        got = list(fused_reference.run_reference(fused, feeds).values())
    else:
        got = run_ort(ir.to_proto(fused), feeds)
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, atol=atol, rtol=rtol)


# ---- fuse_conv_bn ---------------------------------------------------------------------------


@pytest.mark.parametrize("conv_bias", [False, True])
def test_conv_bn_folds_into_conv(conv_bias):
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    inits = [const("w", w), const("g", RNG.uniform(0.5, 2, 4)), const("b", RNG.standard_normal(4)),
             const("m", RNG.standard_normal(4)), const("v", RNG.uniform(0.5, 2, 4))]
    conv_inputs = ["x", "w"]
    if conv_bias:
        inits.append(const("cb", RNG.standard_normal(4)))
        conv_inputs.append("cb")
    nodes = [
        helper.make_node("Conv", conv_inputs, ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["y"], epsilon=1e-3),
    ]
    model = make_model(nodes, [vi("x", [1, 3, 8, 8])], [vi("y", [1, 4, 8, 8])], inits)
    fused, fired = fuse(model, "fuse_conv_bn")
    assert fired == 1
    assert op_types(fused) == ["Conv"]
    assert_same(model, fused, {"x": RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)})


def test_conv_bn_leaves_dynamic_weights_alone():
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"]),
        helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["y"]),
    ]
    inits = [const(n, np.ones(2)) for n in "gbmv"]
    model = make_model(nodes, [vi("x", [1, 2, 4, 4]), vi("w", [2, 2, 1, 1])], [vi("y", [1, 2, 4, 4])], inits)
    fused, fired = fuse(model, "fuse_conv_bn")
    assert fired == 0
    assert op_types(fused) == ["Conv", "BatchNormalization"]


# ---- fuse_bias --------------------------------------------------------------------------------


def test_conv_add_becomes_conv_bias():
    inits = [const("w", RNG.standard_normal((4, 3, 1, 1))), const("b", RNG.standard_normal((1, 4, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Add", ["b", "c"], ["y"])]
    model = make_model(nodes, [vi("x", [1, 3, 5, 5])], [vi("y", [1, 4, 5, 5])], inits)
    fused, fired = fuse(model, "fuse_bias")
    assert fired == 1 and op_types(fused) == ["Conv"]
    assert len(fused.graph.node(0).inputs) == 3
    assert_same(model, fused, {"x": RNG.standard_normal((1, 3, 5, 5)).astype(np.float32)})


def test_conv_add_of_spatial_tensor_is_not_a_bias():
    inits = [const("w", RNG.standard_normal((4, 3, 1, 1))), const("b", RNG.standard_normal((1, 1, 5, 5)))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Add", ["c", "b"], ["y"])]
    model = make_model(nodes, [vi("x", [1, 3, 5, 5])], [vi("y", [1, 4, 5, 5])], inits)
    _, fired = fuse(model, "fuse_bias")
    assert fired == 0


def test_matmul_add_becomes_linear():
    inits = [const("w", RNG.standard_normal((6, 5))), const("b", RNG.standard_normal(5))]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    model = make_model(nodes, [vi("x", [2, 3, 6])], [vi("y", [2, 3, 5])], inits)
    fused, fired = fuse(model, "fuse_bias")
    assert fired >= 1
    assert op_types(fused) == ["Linear"] and fused.graph.node(0).domain == "edgebuild"
    assert len(fused.graph.node(0).inputs) == 3
    assert fused.opset_imports["edgebuild"] == 1
    assert_same(model, fused, {"x": RNG.standard_normal((2, 3, 6)).astype(np.float32)})


def test_plain_matmul_with_constant_weight_becomes_linear():
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", [3, 4])], [vi("y", [3, 2])],
                       [const("w", RNG.standard_normal((4, 2)))])
    fused, fired = fuse(model, "fuse_bias")
    assert fired == 1 and op_types(fused) == ["Linear"]
    assert_same(model, fused, {"x": RNG.standard_normal((3, 4)).astype(np.float32)})


def test_matmul_of_two_activations_stays():
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", [3, 4]), vi("w", [4, 2])],
                       [vi("y", [3, 2])])
    _, fired = fuse(model, "fuse_bias")
    assert fired == 0


@pytest.mark.parametrize("trans_b,alpha,beta", [(0, 1.0, 1.0), (1, 0.5, 2.0)])
def test_gemm_with_add_becomes_linear(trans_b, alpha, beta):
    w = RNG.standard_normal((5, 4) if trans_b else (4, 5))
    inits = [const("w", w), const("c", RNG.standard_normal(5)), const("b2", RNG.standard_normal((1, 5)))]
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["g"], transB=trans_b, alpha=alpha, beta=beta),
             helper.make_node("Add", ["g", "b2"], ["y"])]
    model = make_model(nodes, [vi("x", [3, 4])], [vi("y", [3, 5])], inits)
    fused, fired = fuse(model, "fuse_bias")
    assert fired == 2 and op_types(fused) == ["Linear"]
    assert_same(model, fused, {"x": RNG.standard_normal((3, 4)).astype(np.float32)})


# ---- fuse_activations -----------------------------------------------------------------------


def unary_model(nodes, inits, shape=(2, 8), opset=13):
    return make_model(nodes, [vi("x", list(shape))], [vi("y", list(shape))], inits, opset=opset)


def activation_input(shape=(2, 8)):
    return {"x": (RNG.standard_normal(shape) * 4).astype(np.float32)}


def test_silu():
    model = unary_model([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["s", "x"], ["y"])], [])
    fused, fired = fuse(model, "fuse_activations")
    assert fired == 1 and op_types(fused) == ["Silu"]
    assert_same(model, fused, activation_input())


@pytest.mark.parametrize("bracketing", ["x_half_first", "half_last", "x_dot_cdf_half"])
@pytest.mark.parametrize("inner", ["Div", "Mul"])
def test_gelu_erf(bracketing, inner):
    k = math.sqrt(2) if inner == "Div" else 1 / math.sqrt(2)
    inits = [const("k", np.float32(k)), const("one", np.float32(1)), const("half", np.float32(0.5))]
    nodes = [helper.make_node(inner, ["x", "k"], ["t"]), helper.make_node("Erf", ["t"], ["e"]),
             helper.make_node("Add", ["one", "e"], ["cdf"])]
    if bracketing == "x_half_first":
        nodes += [helper.make_node("Mul", ["x", "half"], ["xh"]), helper.make_node("Mul", ["xh", "cdf"], ["y"])]
    elif bracketing == "half_last":
        nodes += [helper.make_node("Mul", ["x", "cdf"], ["xc"]), helper.make_node("Mul", ["xc", "half"], ["y"])]
    else:
        nodes += [helper.make_node("Mul", ["cdf", "half"], ["ch"]), helper.make_node("Mul", ["x", "ch"], ["y"])]
    model = unary_model(nodes, inits)
    fused, fired = fuse(model, "fuse_activations")
    assert fired == 1 and op_types(fused) == ["Gelu"]
    assert fused.graph.node(0).attributes["approximate"].as_string() == "none"
    assert_same(model, fused, activation_input())


@pytest.mark.parametrize("cube", ["Pow", "Mul"])
def test_gelu_tanh(cube):
    inits = [const("three", np.float32(3)), const("a", np.float32(0.044715)),
             const("c", np.float32(math.sqrt(2 / math.pi))), const("one", np.float32(1)), const("half", np.float32(0.5))]
    if cube == "Pow":
        nodes = [helper.make_node("Pow", ["x", "three"], ["x3"])]
    else:
        nodes = [helper.make_node("Mul", ["x", "x"], ["x2"]), helper.make_node("Mul", ["x2", "x"], ["x3"])]
    nodes += [
        helper.make_node("Mul", ["a", "x3"], ["ax3"]),
        helper.make_node("Add", ["x", "ax3"], ["s"]),
        helper.make_node("Mul", ["c", "s"], ["cs"]),
        helper.make_node("Tanh", ["cs"], ["t"]),
        helper.make_node("Add", ["t", "one"], ["cdf"]),
        helper.make_node("Mul", ["half", "x"], ["xh"]),
        helper.make_node("Mul", ["xh", "cdf"], ["y"]),
    ]
    model = unary_model(nodes, inits)
    fused, fired = fuse(model, "fuse_activations")
    assert fired == 1 and op_types(fused) == ["Gelu"]
    assert fused.graph.node(0).attributes["approximate"].as_string() == "tanh"
    assert_same(model, fused, activation_input())


def hsig_nodes(out="hs"):
    return [helper.make_node("Add", ["x", "three"], ["x3"]), helper.make_node("Clip", ["x3", "zero", "six"], ["r6"]),
            helper.make_node("Div", ["r6", "six"], [out])]


HS_INITS = [const("three", np.float32(3)), const("zero", np.float32(0)), const("six", np.float32(6))]


def test_hard_sigmoid():
    model = unary_model(hsig_nodes("y"), HS_INITS)
    fused, fired = fuse(model, "fuse_activations")
    assert fired == 1 and op_types(fused) == ["HardSigmoid"]
    assert fused.opset_imports[""] == 14
    assert_same(model, fused, activation_input())


def test_hard_sigmoid_from_scaled_clip():
    inits = [const("three", np.float32(3)), const("six", np.float32(6)), const("zero", np.float32(0)),
             const("one", np.float32(1))]
    nodes = [helper.make_node("Add", ["x", "three"], ["a"]), helper.make_node("Div", ["a", "six"], ["d"]),
             helper.make_node("Clip", ["d", "zero", "one"], ["y"])]
    model = unary_model(nodes, inits)
    fused, fired = fuse(model, "fuse_activations")
    assert fired == 1 and op_types(fused) == ["HardSigmoid"]
    assert_same(model, fused, activation_input())


@pytest.mark.parametrize("form", ["x_times_hsig", "div_of_product"])
def test_hard_swish(form):
    if form == "x_times_hsig":
        nodes = hsig_nodes() + [helper.make_node("Mul", ["x", "hs"], ["y"])]
    else:
        nodes = [helper.make_node("Add", ["x", "three"], ["x3"]), helper.make_node("Clip", ["x3", "zero", "six"], ["r6"]),
                 helper.make_node("Mul", ["r6", "x"], ["p"]), helper.make_node("Div", ["p", "six"], ["y"])]
    model = unary_model(nodes, HS_INITS)
    fused, fired = fuse(model, "fuse_activations")
    assert fired >= 1 and op_types(fused) == ["HardSwish"]
    assert fused.opset_imports[""] == 14
    assert_same(model, fused, activation_input())


def test_relu6_from_min_max_is_a_clip():
    nodes = [helper.make_node("Max", ["x", "zero"], ["m"]), helper.make_node("Min", ["m", "six"], ["y"])]
    model = unary_model(nodes, HS_INITS[1:])
    fused, fired = fuse(model, "fuse_activations")
    assert fired == 1 and op_types(fused) == ["Clip"]
    assert_same(model, fused, activation_input())


def test_wrong_constant_does_not_fuse():
    inits = [const("three", np.float32(3)), const("zero", np.float32(0)), const("six", np.float32(6)),
             const("five", np.float32(5))]
    nodes = [helper.make_node("Add", ["x", "three"], ["x3"]), helper.make_node("Clip", ["x3", "zero", "six"], ["r6"]),
             helper.make_node("Div", ["r6", "five"], ["y"])]
    _, fired = fuse(unary_model(nodes, inits), "fuse_activations")
    assert fired == 0


# ---- fuse_layer_norm --------------------------------------------------------------------------


def layer_norm_model(opset: int, affine: bool, use_pow: bool = True):
    d = 8
    inits = [const("two", np.float32(2)), const("eps", np.float32(1e-5))]
    axes_kw = {"axes": [-1]} if opset < 18 else {}
    mean_in = ["x"] if opset < 18 else ["x", "axes"]
    if opset >= 18:
        inits.append(numpy_helper.from_array(np.array([-1], np.int64), "axes"))
    nodes = [
        helper.make_node("ReduceMean", mean_in, ["mu"], **axes_kw),
        helper.make_node("Sub", ["x", "mu"], ["dev"]),
        helper.make_node("Pow", ["dev", "two"], ["sq"]) if use_pow else helper.make_node("Mul", ["dev", "dev"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"] + mean_in[1:], ["var"], **axes_kw),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["dev", "sd"], ["n" if affine else "y"]),
    ]
    if affine:
        inits += [const("gamma", RNG.uniform(0.5, 1.5, d)), const("beta", RNG.standard_normal(d))]
        nodes += [helper.make_node("Mul", ["n", "gamma"], ["ns"]), helper.make_node("Add", ["ns", "beta"], ["y"])]
    return make_model(nodes, [vi("x", [2, 3, d])], [vi("y", [2, 3, d])], inits, opset=opset)


@pytest.mark.parametrize("opset,affine,use_pow", [(13, True, True), (13, False, False), (18, True, True)])
def test_layer_norm(opset, affine, use_pow):
    model = layer_norm_model(opset, affine, use_pow)
    fused, fired = fuse(model, "fuse_layer_norm")
    assert fired == (3 if affine else 1)
    assert op_types(fused) == ["LayerNormalization"]
    assert fused.opset_imports[""] == max(17, opset)
    assert_same(model, fused, {"x": RNG.standard_normal((2, 3, 8)).astype(np.float32)}, atol=1e-4)


# ---- fuse_attention ---------------------------------------------------------------------------


def attention_model(scale_op: str | None, mask: bool, perm=(0, 1, 3, 2)):
    b, h, lq, lk, d = 1, 2, 3, 4, 5
    k_shape = [b, h, lk, d] if list(perm) == [0, 1, 3, 2] else [b, lk, h, d]
    inputs = [vi("q", [b, h, lq, d]), vi("k", k_shape), vi("v", [b, h, lk, d])]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=list(perm)), helper.make_node("MatMul", ["q", "kt"], ["s"])]
    inits = []
    last = "s"
    if scale_op:
        inits.append(const("sc", np.float32(math.sqrt(d) if scale_op == "Div" else 1 / math.sqrt(d))))
        nodes.append(helper.make_node(scale_op, [last, "sc"], ["ss"]))
        last = "ss"
    if mask:
        inputs.append(vi("mask", [b, 1, lq, lk]))
        nodes.append(helper.make_node("Add", ["mask", last], ["sm"]))
        last = "sm"
    nodes += [helper.make_node("Softmax", [last], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    model = make_model(nodes, inputs, [vi("y", [b, h, lq, d])], inits)
    feeds = {"q": RNG.standard_normal((b, h, lq, d)).astype(np.float32),
             "k": RNG.standard_normal(k_shape).astype(np.float32),
             "v": RNG.standard_normal((b, h, lk, d)).astype(np.float32)}
    if mask:
        feeds["mask"] = np.where(RNG.random((b, 1, lq, lk)) < 0.3, -1e4, 0).astype(np.float32)
    return model, feeds


@pytest.mark.parametrize("scale_op,mask", [(None, False), ("Mul", False), ("Div", True), ("Mul", True), (None, True)])
def test_attention(scale_op, mask):
    model, feeds = attention_model(scale_op, mask)
    fused, fired = fuse(model, "fuse_attention")
    assert fired == 1
    assert op_types(fused) == ["ScaledDotProductAttention"]
    node = fused.graph.node(0)
    assert len(node.inputs) == (4 if mask else 3)
    expected_scale = 1 / math.sqrt(5) if scale_op else 1.0
    assert node.attributes["scale"].as_float() == pytest.approx(expected_scale, rel=1e-6)
    assert_same(model, fused, feeds)


def test_attention_with_head_split_transpose_keeps_a_transpose_on_k():
    model, feeds = attention_model("Div", False, perm=(0, 2, 3, 1))
    fused, fired = fuse(model, "fuse_attention")
    assert fired == 1
    assert op_types(fused) == ["Transpose", "ScaledDotProductAttention"]
    assert list(fused.graph.node(0).attributes["perm"].as_ints()) == [0, 2, 1, 3]
    assert_same(model, fused, feeds)


def test_attention_as_torch_exports_it():
    """sqrt(scale) on Q and on K^T, a NaN guard after the softmax."""
    b, h, l, d = 1, 2, 4, 8
    root = np.float32(d ** -0.25)
    inits = [const("r", root), const("zero", np.float32(0))]
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("Mul", ["q", "r"], ["qs"]), helper.make_node("Mul", ["kt", "r"], ["kts"]),
        helper.make_node("MatMul", ["qs", "kts"], ["s"]), helper.make_node("Add", ["s", "mask"], ["sm"]),
        helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
        helper.make_node("IsNaN", ["p"], ["nan"]), helper.make_node("Where", ["nan", "zero", "p"], ["pg"]),
        helper.make_node("MatMul", ["pg", "v"], ["y"]),
    ]
    shape = [b, h, l, d]
    model = make_model(nodes, [vi("q", shape), vi("k", shape), vi("v", shape), vi("mask", [b, 1, 1, l])],
                       [vi("y", shape)], inits)
    feeds = {n: RNG.standard_normal(shape).astype(np.float32) for n in "qkv"}
    feeds["mask"] = np.array([0, 0, 0, -np.inf], np.float32).reshape(b, 1, 1, l)
    fused, fired = fuse(model, "fuse_attention")
    assert fired == 1 and op_types(fused) == ["ScaledDotProductAttention"]
    assert fused.graph.node(0).attributes["scale"].as_float() == pytest.approx(d ** -0.5, rel=1e-6)
    assert_same(model, fused, feeds)


def test_softmax_on_other_axis_is_not_attention():
    model, _ = attention_model(None, False)
    for node in model.graph.node:
        if node.op_type == "Softmax":
            node.attribute[0].i = 2
    _, fired = fuse(model, "fuse_attention")
    assert fired == 0


# ---- dequantize_weights ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype,zero_point,per_channel", [
    (np.int8, None, False), (np.uint8, 128.0, False), (np.int8, "cast", True), (np.uint8, 3.0, True),
])
def test_weight_dequantisation_becomes_dequantize_linear(dtype, zero_point, per_channel):
    info = np.iinfo(dtype)
    wq = RNG.integers(info.min, info.max, (6, 4)).astype(dtype)
    scale = RNG.uniform(0.01, 0.1, (1, 4) if per_channel else ()).astype(np.float32)
    inits = [numpy_helper.from_array(wq, "wq"), const("scale", scale)]
    nodes = [helper.make_node("Cast", ["wq"], ["wf"], to=F)]
    centred = "wf"
    if zero_point == "cast":
        inits.append(numpy_helper.from_array(np.array([1, -2, 0, 5], dtype), "zq"))
        nodes += [helper.make_node("Cast", ["zq"], ["zf"], to=F), helper.make_node("Sub", ["wf", "zf"], ["wc"])]
        centred = "wc"
    elif zero_point is not None:
        inits.append(const("zp", np.float32(zero_point)))
        nodes.append(helper.make_node("Sub", ["wf", "zp"], ["wc"]))
        centred = "wc"
    nodes += [helper.make_node("Mul", [centred, "scale"], ["w"]), helper.make_node("MatMul", ["x", "w"], ["y"])]
    model = make_model(nodes, [vi("x", [3, 6])], [vi("y", [3, 4])], inits)
    fused, fired = fuse(model, "dequantize_weights")
    assert fired == 1
    assert op_types(fused)[-2:] == ["DequantizeLinear", "MatMul"]
    dq = next(n for n in fused.graph if n.op_type == "DequantizeLinear")
    assert dq.inputs[0].const_value.dtype in (ir.DataType.INT8, ir.DataType.UINT8)
    assert_same(model, fused, {"x": RNG.standard_normal((3, 6)).astype(np.float32)})


def test_float_weights_are_not_dequantised():
    inits = [const("wq", RNG.standard_normal((6, 4))), const("scale", np.float32(0.1))]
    nodes = [helper.make_node("Cast", ["wq"], ["wf"], to=F), helper.make_node("Mul", ["wf", "scale"], ["y"])]
    model = make_model(nodes, [], [vi("y", [6, 4])], inits)
    _, fired = fuse(model, "dequantize_weights")
    assert fired == 0


# ---- registry ---------------------------------------------------------------------------------


def test_every_required_pass_is_registered_with_a_description():
    from edgebuild.registry import build_registry

    table = build_registry().tables["passes"]
    for name in ["fuse_conv_bn", "fuse_bias", "fuse_activations", "fuse_layer_norm", "fuse_attention",
                 "dequantize_weights"]:
        assert name in table
        graph_pass = table[name].obj
        assert graph_pass.name == name and graph_pass.description and isinstance(graph_pass.default, bool)


def test_the_registered_passes_state_what_their_implementations_do():
    """The core plugin knows each fusion pass's default and order without importing it: the facts must agree."""
    from edgebuild.graph.fusion import PASSES
    from edgebuild.registry import build_registry

    table = build_registry().tables["passes"]
    for name, implementation in PASSES.items():
        registered = table[name].obj
        assert (registered.default, registered.before_folding) == (implementation.default, implementation.before_folding)
