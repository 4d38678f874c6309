"""Each ONNX op, lowered to MPSGraph ops and run by the reference executor, against
onnxruntime (edgebuild:: fused ops against their numpy definitions in fused_reference).

Data inputs are graph inputs, so nothing folds at build time: the executor computes them.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgebuild_mpsgraph import load_program, run_program, save_program
from edgebuild_mpsgraph.lowering import lower_model

rng = np.random.default_rng(7)
F = np.float32


def rand(*shape, low=-2.0, high=2.0, dtype=F):
    return rng.uniform(low, high, size=shape).astype(dtype)


def case(op, inputs, consts=None, attrs=None, outputs=1, opset=18, domain=""):
    return dict(op=op, inputs=inputs, consts=consts or {}, attrs=attrs or {}, outputs=outputs, opset=opset,
                domain=domain)


def model_of(c) -> onnx.ModelProto:
    names = list(c["inputs"]) + list(c["consts"])
    order = c.get("order") or names
    outs = [f"out{i}" for i in range(c["outputs"])]
    node = helper.make_node(c["op"], order, outs, domain=c["domain"], **c["attrs"])
    graph = helper.make_graph(
        [node], "op",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in c["inputs"].items()],
        [helper.make_empty_tensor_value_info(o) for o in outs],
        [numpy_helper.from_array(a, n) for n, a in c["consts"].items()])
    opsets = [helper.make_opsetid("", c["opset"])] + ([helper.make_opsetid(c["domain"], 1)] if c["domain"] else [])
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def inferred(proto: onnx.ModelProto) -> ir.Model:
    try:
        proto = onnx.shape_inference.infer_shapes(proto)
    except Exception:
        pass
    return ir.serde.deserialize_model(proto)


def with_order(c, order):
    c["order"] = order
    return c


CASES = {
    "Add_broadcast": case("Add", {"a": rand(2, 3, 4), "b": rand(3, 1)}),
    "Sub": case("Sub", {"a": rand(2, 3), "b": rand(2, 3)}),
    "Mul_const": case("Mul", {"a": rand(2, 5)}, {"b": rand(5)}),
    "Div": case("Div", {"a": rand(4, 4)}, {"b": rand(4, low=0.5, high=2.0)}),
    "Div_int": case("Div", {"a": np.array([7, -7, 9], np.int64), "b": np.array([2, 2, -4], np.int64)}),
    "Pow": case("Pow", {"a": rand(6, low=0.1, high=3.0)}, {"b": np.array(2.5, F)}),
    "Max": case("Max", {"a": rand(3, 4), "b": rand(4)}),
    "Min": case("Min", {"a": rand(3, 4), "b": rand(3, 4)}),
    "Relu": case("Relu", {"x": rand(2, 8)}),
    "Sigmoid": case("Sigmoid", {"x": rand(2, 8)}),
    "Tanh": case("Tanh", {"x": rand(2, 8)}),
    "Exp": case("Exp", {"x": rand(2, 8)}),
    "Log": case("Log", {"x": rand(2, 8, low=0.1, high=5.0)}),
    "Sqrt": case("Sqrt", {"x": rand(2, 8, low=0.0, high=5.0)}),
    "Erf": case("Erf", {"x": rand(2, 8)}),
    "Abs": case("Abs", {"x": rand(9)}),
    "Neg": case("Neg", {"x": rand(9)}),
    "LeakyRelu": case("LeakyRelu", {"x": rand(2, 8)}, attrs={"alpha": 0.1}),
    "HardSigmoid": case("HardSigmoid", {"x": rand(2, 8, low=-5, high=5)}, attrs={"alpha": 0.25, "beta": 0.4}),
    "HardSwish": case("HardSwish", {"x": rand(2, 16, low=-5, high=5)}),
    "Clip": case("Clip", {"x": rand(3, 5)}, {"lo": np.array(-0.5, F), "hi": np.array(0.7, F)}),
    "Where": case("Where", {"c": rng.integers(0, 2, (3, 4)).astype(bool), "a": rand(3, 4), "b": rand(4)}),
    "Equal": case("Equal", {"a": np.array([1, 2, 3], np.int64), "b": np.array([1, 0, 3], np.int64)}),
    "Cast": case("Cast", {"x": rand(2, 3, low=-10, high=10)}, attrs={"to": TensorProto.INT32}),
    "Conv": case("Conv", {"x": rand(1, 3, 9, 11)}, {"w": rand(4, 3, 3, 3), "bias": rand(4)},
                 attrs={"pads": [1, 0, 2, 1], "strides": [2, 1]}),
    "Conv_depthwise_dilated": case("Conv", {"x": rand(2, 6, 10, 10)}, {"w": rand(6, 1, 3, 3)},
                                   attrs={"group": 6, "dilations": [2, 2], "pads": [2, 1, 2, 1]}),
    "Conv_same_upper": case("Conv", {"x": rand(1, 2, 7, 8)}, {"w": rand(3, 2, 4, 3)}, attrs={"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    "Conv_grouped": case("Conv", {"x": rand(1, 4, 7, 7)}, {"w": rand(6, 2, 1, 1)}, attrs={"group": 2}),
    "MaxPool_ceil": case("MaxPool", {"x": rand(1, 2, 7, 8)}, attrs={"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "MaxPool_pads": case("MaxPool", {"x": rand(1, 2, 6, 6)}, attrs={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    "AveragePool_exclude_pad": case("AveragePool", {"x": rand(1, 2, 6, 7)},
                                    attrs={"kernel_shape": [3, 2], "pads": [1, 1, 1, 0], "strides": [2, 2]}),
    "AveragePool_include_pad": case("AveragePool", {"x": rand(1, 2, 6, 7)},
                                    attrs={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    "GlobalAveragePool": case("GlobalAveragePool", {"x": rand(2, 3, 5, 4)}),
    "BatchNormalization": case("BatchNormalization", {"x": rand(2, 3, 4, 4)},
                               {"s": rand(3), "b": rand(3), "m": rand(3), "v": rand(3, low=0.5, high=2)}),
    "LayerNormalization": case("LayerNormalization", {"x": rand(2, 5, 16)}, {"g": rand(16), "b": rand(16)},
                               attrs={"epsilon": 1e-5}),
    "LayerNormalization_axis": case("LayerNormalization", {"x": rand(2, 3, 4)}, {"g": rand(3, 4)}, attrs={"axis": 1}),
    "Softmax": case("Softmax", {"x": rand(2, 3, 7)}),
    "Softmax_axis1": case("Softmax", {"x": rand(2, 3, 7)}, attrs={"axis": 1}),
    "MatMul_batched": case("MatMul", {"a": rand(2, 3, 4, 5), "b": rand(5, 6)}),
    "Gemm": case("Gemm", {"a": rand(3, 4)}, {"b": rand(5, 4), "c": rand(5)},
                 attrs={"transB": 1, "alpha": 0.5, "beta": 2.0}),
    "Reshape": case("Reshape", {"x": rand(2, 3, 4)}, {"s": np.array([0, -1], np.int64)}),
    "Flatten": case("Flatten", {"x": rand(2, 3, 4, 5)}, attrs={"axis": 2}),
    "Squeeze": case("Squeeze", {"x": rand(2, 1, 4, 1)}, {"axes": np.array([1, -1], np.int64)}),
    "Unsqueeze": case("Unsqueeze", {"x": rand(2, 4)}, {"axes": np.array([0, -1], np.int64)}),
    "Transpose": case("Transpose", {"x": rand(2, 3, 4, 5)}, attrs={"perm": [0, 2, 3, 1]}),
    "Concat": case("Concat", {"a": rand(2, 3), "b": rand(2, 5)}, attrs={"axis": -1}),
    "Slice": case("Slice", {"x": rand(4, 10, 6)}, {"st": np.array([1, -2], np.int64), "en": np.array([10, 0], np.int64),
                                                    "ax": np.array([1, 2], np.int64), "sp": np.array([3, -1], np.int64)}),
    "Split": case("Split", {"x": rand(2, 7)}, {"sizes": np.array([3, 4], np.int64)}, attrs={"axis": 1}, outputs=2),
    "Gather": case("Gather", {"x": rand(5, 4)}, {"i": np.array([[0, -1], [2, 4]], np.int64)}, attrs={"axis": 0}),
    "Gather_runtime_indices": case("Gather", {"x": rand(10, 3), "i": np.array([3, 0, 9], np.int64)}),
    "Expand": case("Expand", {"x": rand(3, 1)}, {"s": np.array([2, 1, 4], np.int64)}),
    "ReduceSum": case("ReduceSum", {"x": rand(2, 3, 4)}, {"axes": np.array([1], np.int64)}, attrs={"keepdims": 0}),
    "ReduceMean": case("ReduceMean", {"x": rand(2, 3, 4)}, {"axes": np.array([-1, 0], np.int64)}),
    "ReduceMax": case("ReduceMax", {"x": rand(2, 3, 4)}, attrs={"keepdims": 0}),
    "Resize_nearest_asymmetric": case("Resize", {"x": rand(1, 2, 3, 4)},
                                      {"roi": np.zeros(0, F), "sc": np.array([1, 1, 2, 2], F)},
                                      attrs={"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
                                             "nearest_mode": "floor"}),
    "Resize_nearest_half_pixel": case("Resize", {"x": rand(1, 2, 3, 4)},
                                      {"roi": np.zeros(0, F), "sc": np.array([1, 1, 2, 3], F)}, attrs={"mode": "nearest"}),
    "Resize_linear_half_pixel": case("Resize", {"x": rand(1, 2, 4, 5)},
                                     {"roi": np.zeros(0, F), "sc": np.array([1, 1, 2, 1.6], F)}, attrs={"mode": "linear"}),
    "Resize_linear_align_corners": case("Resize", {"x": rand(1, 1, 3, 4)},
                                        {"roi": np.zeros(0, F), "sc": np.zeros(0, F), "sz": np.array([1, 1, 5, 7], np.int64)},
                                        attrs={"mode": "linear", "coordinate_transformation_mode": "align_corners"}),
}


def lower_and_run(c, tmp_path):
    program = lower_model(inferred(model_of(c)))
    save_program(program, tmp_path)
    reloaded = load_program(tmp_path)  # the saved form is what runs
    return run_program(reloaded, c["inputs"]), program


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_matches_onnxruntime(name, tmp_path):
    import onnxruntime as ort

    c = CASES[name]
    got, program = lower_and_run(c, tmp_path)
    session = ort.InferenceSession(model_of(c).SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, c["inputs"])
    assert program.ops, "the op must be computed by the executor, not folded"
    for i, expected in enumerate(want):
        actual = got[f"out{i}"]
        assert actual.shape == expected.shape and actual.dtype == expected.dtype, (actual.shape, actual.dtype, expected.dtype)
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


FUSED = {
    "Linear": (case("Linear", {"x": rand(2, 3, 8)}, {"w": rand(8, 5), "b": rand(5)}, domain="edgebuild"),
               lambda r, c: r.linear(c["inputs"]["x"], c["consts"]["w"], c["consts"]["b"])),
    "Silu": (case("Silu", {"x": rand(4, 6)}, domain="edgebuild"), lambda r, c: r.silu(c["inputs"]["x"])),
    "Gelu": (case("Gelu", {"x": rand(4, 6)}, domain="edgebuild"), lambda r, c: r.gelu(c["inputs"]["x"])),
    "Gelu_tanh": (case("Gelu", {"x": rand(4, 6)}, attrs={"approximate": "tanh"}, domain="edgebuild"),
                  lambda r, c: r.gelu(c["inputs"]["x"], "tanh")),
    "ScaledDotProductAttention": (
        case("ScaledDotProductAttention", {"q": rand(1, 2, 5, 8), "k": rand(1, 2, 7, 8), "v": rand(1, 2, 7, 8),
                                           "mask": rand(1, 1, 5, 7)}, attrs={"scale": 0.35}, domain="edgebuild"),
        lambda r, c: r.scaled_dot_product_attention(*c["inputs"].values(), scale=0.35)),
}


@pytest.mark.parametrize("name", sorted(FUSED))
def test_fused_op_matches_its_definition(name, tmp_path):
    from edgebuild.graph import fused_reference

    c, reference = FUSED[name]
    got, _ = lower_and_run(c, tmp_path)
    np.testing.assert_allclose(got["out0"], reference(fused_reference, c), rtol=1e-5, atol=1e-5)


def test_weights_are_aligned_and_shapes_recorded(tmp_path):
    import json

    from edgebuild_mpsgraph.program import ALIGNMENT

    lower_and_run(CASES["Conv"], tmp_path)
    document = json.loads((tmp_path / "program.json").read_text())
    assert document["format"] == "edgebuild-mpsgraph" and document["version"] == 1
    assert all(c["offset"] % ALIGNMENT == 0 for c in document["constants"])
    assert document["outputs"] == [{"name": "out0", "dtype": "float32", "shape": [1, 4, 5, 10]}]
    assert [o["op"] for o in document["ops"]] == ["convolution2D", "addition"]


def test_shape_computations_fold_at_build_time(tmp_path):
    # Reshape(x, Shape(y)): the target shape is static, so no shape op reaches the program
    nodes = [helper.make_node("Shape", ["y"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["out0"])]
    graph = helper.make_graph(nodes, "fold", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6]),
                                              helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("out0", TensorProto.FLOAT, [2, 3])])
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    program = lower_model(model)
    assert [op.op for op in program.ops] == ["reshape"]
    x = rand(6)
    np.testing.assert_array_equal(run_program(program, {"x": x, "y": rand(2, 3)})["out0"], x.reshape(2, 3))


def test_unsupported_op_names_the_node():
    from edgebuild.errors import BuildError

    c = case("Hardmax", {"x": rand(2, 3)})
    with pytest.raises(BuildError, match="Hardmax has no MPSGraph lowering"):
        lower_model(inferred(model_of(c)))
