"""The float64 evaluation of a source graph (validate.reference: float64), on small generated graphs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgebuild.verify import float64

def _weights():
    rng = np.random.default_rng(7)
    return {
        "w": rng.normal(size=(16, 16)).astype(np.float32),
        "wq": rng.integers(-128, 128, size=(16, 16)).astype(np.int8),
        "scale": np.float32(0.0123),
        "gamma": rng.normal(size=16).astype(np.float32),
        "beta": rng.normal(size=16).astype(np.float32),
    }


def _model(w) -> onnx.ModelProto:
    """erf(x @ w) * 0.1 + float(ids), and LayerNorm(x @ dequantize(wq)): every converted construct
    (initializer, Constant value_float, Cast to float, stash_type, a float-only op)."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Erf", ["m"], ["e"]),
        helper.make_node("Constant", [], ["k"], value_float=0.1),
        helper.make_node("Mul", ["e", "k"], ["ek"]),
        helper.make_node("Cast", ["ids"], ["ids_f"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["ek", "ids_f"], ["y"]),
        helper.make_node("DequantizeLinear", ["wq", "scale"], ["wd"], name="dq"),
        helper.make_node("MatMul", ["x", "wd"], ["h"]),
        helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["z"], epsilon=1e-5),
    ]
    initializers = [numpy_helper.from_array(np.asarray(value), name) for name, value in w.items()]
    graph = helper.make_graph(
        nodes, "noise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 16])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def _numpy_float64(x, ids, w):
    erf = np.vectorize(math.erf)
    y = erf(x.astype(np.float64) @ w["w"].astype(np.float64)) * np.float64(np.float32(0.1)) + ids
    dequantized = (w["wq"].astype(np.float32) * w["scale"]).astype(np.float64)  # DequantizeLinear is float32
    h = x.astype(np.float64) @ dequantized
    centred = h - h.mean(axis=-1, keepdims=True)
    z = centred / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + 1e-5) * w["gamma"] + w["beta"]
    return y, z


def test_float64_graph_matches_numpy_float64():
    w = _weights()
    model = _model(w)
    onnx.checker.check_model(model)
    converted = float64.to_float64(model)
    onnx.checker.check_model(converted, full_check=True)  # every op sees the types it accepts
    assert converted.graph.output[0].type.tensor_type.elem_type == TensorProto.DOUBLE
    assert model.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT  # source untouched

    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 16)).astype(np.float32)
    ids = rng.integers(0, 5, size=(4, 16))
    run, evaluator = float64.float64_runner(converted)
    out = run(float64.as_float64_feed({"x": x, "ids": ids}))
    y64, z64 = _numpy_float64(x, ids, w)

    assert out["y"].dtype == np.float64 and out["z"].dtype == np.float64, evaluator
    np.testing.assert_allclose(out["y"], y64, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out["z"], z64, rtol=1e-10, atol=1e-10)

    # the same graph in float32 is visibly further from the float64 answer: the check can fail
    from onnx.reference import ReferenceEvaluator

    y32, z32 = ReferenceEvaluator(model).run(None, {"x": x, "ids": ids})
    assert np.abs(z32 - z64).max() > 1e3 * np.abs(out["z"] - z64).max()


def test_float_only_ops_stay_float_behind_casts():
    converted = float64.to_float64(_model(_weights()))
    [dequantize] = [n for n in converted.graph.node if n.op_type == "DequantizeLinear"]
    casts = {n.output[0]: n for n in converted.graph.node if n.op_type == "Cast"}
    scale_cast = casts[dequantize.input[1]]  # the scale is cast back down to float
    assert scale_cast.input[0] == "scale" and scale_cast.attribute[0].i == TensorProto.FLOAT
    assert casts["wd"].input[0] == dequantize.output[0]  # and its float output up to double
    assert casts["wd"].attribute[0].i == TensorProto.DOUBLE
    [norm] = [n for n in converted.graph.node if n.op_type == "LayerNormalization"]
    assert helper.get_attribute_value(next(a for a in norm.attribute if a.name == "stash_type")) == TensorProto.DOUBLE


def test_onnxruntime_evaluates_the_float64_graph_when_it_has_the_kernels():
    w = _weights()
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["z"], epsilon=1e-5)]
    graph = helper.make_graph(
        nodes, "norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 16])],
        [numpy_helper.from_array(w[name], name) for name in ("w", "gamma", "beta")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    run, evaluator = float64.float64_runner(float64.to_float64(model))
    assert evaluator == "onnxruntime"

    x = np.random.default_rng(1).normal(size=(4, 16)).astype(np.float32)
    h = x.astype(np.float64) @ w["w"].astype(np.float64)
    centred = h - h.mean(axis=-1, keepdims=True)
    expected = centred / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + 1e-5) * w["gamma"] + w["beta"]
    np.testing.assert_allclose(run(float64.as_float64_feed({"x": x}))["z"], expected, rtol=1e-10, atol=1e-10)


def test_batch_normalization_with_momentum_is_evaluated_as_inference():
    """Exported inference graphs carry ``momentum``; onnx's reference evaluator would switch to
    training mode (batch statistics) on it."""
    rng = np.random.default_rng(3)
    stats = {name: rng.uniform(0.5, 2.0, size=3).astype(np.float32) for name in ("s", "b", "mean", "var")}
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "mean", "var"], ["n"], epsilon=1e-5, momentum=0.9),
             helper.make_node("Erf", ["n"], ["y"])]  # no double Erf in onnxruntime: the reference evaluator runs it
    graph = helper.make_graph(
        nodes, "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4, 4])],
        [numpy_helper.from_array(value, name) for name, value in stats.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    run, evaluator = float64.float64_runner(float64.to_float64(model))
    assert evaluator.startswith("onnx reference")

    x = rng.normal(size=(2, 3, 4, 4)).astype(np.float32)
    channel = {name: value.astype(np.float64).reshape(1, 3, 1, 1) for name, value in stats.items()}
    eps = float(np.float32(1e-5))
    normalised = (x - channel["mean"]) / np.sqrt(channel["var"] + eps) * channel["s"] + channel["b"]
    np.testing.assert_allclose(run({"x": x.astype(np.float64)})["y"], np.vectorize(math.erf)(normalised),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("opset", [10, 13, 18, 19, 21])
@pytest.mark.parametrize("zero_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("per_axis", [False, True])
def test_quantised_graphs_of_every_opset_evaluate_in_float64(opset, zero_dtype, per_axis):
    """onnx's reference evaluator implements DequantizeLinear from opset 19 only; a QDQ graph
    of opset 10-18 whose other ops onnxruntime has no double kernel for (Erf) still evaluates."""
    if per_axis and opset < 13:
        pytest.skip("per-axis quantisation starts at opset 13")
    rng = np.random.default_rng(opset)
    scale = rng.uniform(0.01, 0.1, size=3 if per_axis else ()).astype(np.float32)
    zero = (np.full(3, 7) if per_axis else np.array(7)).astype(zero_dtype)
    attrs = {"axis": 1} if per_axis else {}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **attrs),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], **attrs),
             helper.make_node("Erf", ["d"], ["y"])]
    graph = helper.make_graph(
        nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])],
        [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zero, "z")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9 if opset < 21 else 10)
    run, evaluator = float64.float64_runner(float64.to_float64(model))
    assert evaluator.startswith("onnx reference")

    x = rng.normal(size=(2, 3, 4)).astype(np.float32)
    s = scale.reshape(1, 3, 1) if per_axis else scale
    z = zero.reshape(1, 3, 1).astype(np.float64) if per_axis else float(zero)
    info = np.iinfo(zero_dtype)
    q = np.clip(np.rint(x / s) + z, info.min, info.max)
    dequantized = ((q - z) * s).astype(np.float32).astype(np.float64)  # DequantizeLinear computes in float
    np.testing.assert_allclose(run({"x": x.astype(np.float64)})["y"], np.vectorize(math.erf)(dequantized),
                               rtol=1e-6, atol=1e-6)
