"""Weight-only mode: ``quantization: {activations: float}`` (edgebuild/graph/quantized/activations.py),
from the recipe field through the optimise stage's key and record to the report.

Graphs are hand-built QDQ graphs of the shapes onnxruntime's quantize_static (QuantizeLinear ->
DequantizeLinear around every op, int8 weights behind DequantizeLinear) and dynamic quantisation
(DynamicQuantizeLinear -> DequantizeLinear) write; onnx's reference evaluator runs them.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgebuild.build.jobs import load_variants
from edgebuild.dag.stages import pipeline
from edgebuild.errors import RecipeError
from edgebuild.graph.fused_reference import run_reference
from edgebuild.graph.optimize import optimize
from edgebuild.graph.quantized.activations import (
    FloatActivations,
    count_weight_dequantizers,
)
from edgebuild.registry import get_registry
from edgebuild.report.console import detail_lines
from edgebuild.report.html import render_report

RNG = np.random.default_rng(0)
WEIGHT = RNG.integers(-127, 128, (8, 3, 3, 3)).astype(np.int8)
W_SCALE = np.linspace(0.002, 0.006, 8, dtype=np.float32)


def _init(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def qdq_conv_model(opset=13) -> onnx.ModelProto:
    """x -> Q/DQ -> Conv(DQ(int8 weight, per channel)) -> Q/DQ -> Relu -> y (quantize_static's QDQ form)."""
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="x_q"),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xf"], name="x_dq"),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], name="w_dq", axis=0),
        helper.make_node("Conv", ["xf", "wf"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["c", "cs", "cz"], ["cq"], name="c_q"),
        helper.make_node("DequantizeLinear", ["cq", "cs", "cz"], ["cf"], name="c_dq"),
        helper.make_node("Relu", ["cf"], ["y"], name="relu"),
    ]
    inits = [_init("xs", np.float32(0.02)), _init("xz", np.uint8(128)), _init("w", WEIGHT), _init("ws", W_SCALE),
             _init("wz", np.zeros(8, np.int8)), _init("cs", np.float32(0.05)), _init("cz", np.uint8(128))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 6, 6])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def float_conv(x: np.ndarray) -> np.ndarray:
    """What the weight-only graph computes: the float conv with the dequantised weight, then Relu, each
    activation clipped to the range its quantiser saturated to (uint8, zero point 128)."""
    weight = WEIGHT.astype(np.float32) * W_SCALE.reshape(8, 1, 1, 1)
    x = np.clip(x, -128 * 0.02, 127 * 0.02)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["c", "lo", "hi"], ["cc"]), helper.make_node("Relu", ["cc"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [_init("w", weight), _init("lo", np.float32(-128 * 0.05)), _init("hi", np.float32(127 * 0.05))])
    return run_reference(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), {"x": x})["y"]


def node_types(model: ir.Model) -> list[str]:
    return [node.op_type for node in model.graph]


# -- the pass -------------------------------------------------------------------------------------
def test_float_mode_removes_activation_pairs_and_keeps_the_weight():
    model = ir.serde.deserialize_model(qdq_conv_model())
    assert FloatActivations().apply(model) == 2
    ir_pass_cleanup(model)
    assert [t for t in node_types(model) if t != "Constant"] == ["Clip", "DequantizeLinear", "Conv", "Clip", "Relu"]
    assert count_weight_dequantizers(model) == 1
    x = RNG.uniform(-3, 3, (1, 3, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(run_reference(model, {"x": x})["y"], float_conv(x), rtol=1e-5, atol=1e-5)


def ir_pass_cleanup(model: ir.Model) -> None:
    """What the optimise stage's clean-up does after the pass: Identity and unused quantisers go."""
    from onnx_ir.passes import common

    for node in [n for n in model.graph if n.op_type == "Identity"]:
        ir.convenience.replace_all_uses_with(node.outputs[0], node.inputs[0])
        model.graph.remove(node, safe=True)
    common.RemoveUnusedNodesPass()(model)


def test_the_quantisers_range_stays_where_onnxruntime_dropped_a_relu(tmp_path):
    """quantize_static removes a Relu when the next QuantizeLinear (zero point 0, uint8) clamps at 0 anyway."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 50])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 50])],
                              [_init("s", np.float32(0.02)), _init("z", np.uint8(0))])
    source = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), source)
    optimize(source, tmp_path / "opt", quantization={"activations": "float"})
    x = RNG.uniform(-8, 8, (2, 50)).astype(np.float32)
    np.testing.assert_allclose(run_reference(ir.load(tmp_path / "opt" / "model.onnx"), {"x": x})["y"],
                               np.clip(x, 0, 255 * 0.02), rtol=1e-6)


def test_dynamic_quantisation_pairs_are_removed():
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xf"]),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"]),
        helper.make_node("MatMul", ["xf", "wf"], ["y"]),
    ]
    inits = [_init("w", RNG.integers(-127, 128, (6, 4)).astype(np.int8)), _init("ws", np.float32(0.01)),
             _init("wz", np.int8(0))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])], inits)
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    assert FloatActivations().apply(model) == 1
    ir_pass_cleanup(model)
    assert node_types(model) == ["DequantizeLinear", "MatMul"]


def test_a_quantised_constant_is_a_weight_and_stays():
    """QuantizeLinear of a float initializer (a weight quantised in the graph) is not an activation."""
    nodes = [helper.make_node("QuantizeLinear", ["w", "s", "z"], ["wq"]),
             helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["wf"]),
             helper.make_node("MatMul", ["x", "wf"], ["y"])]
    inits = [_init("w", RNG.standard_normal((6, 4)).astype(np.float32)), _init("s", np.float32(0.01)),
             _init("z", np.int8(0))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])], inits)
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    assert FloatActivations().apply(model) == 0


def test_a_pair_at_the_graph_output_keeps_the_output_name(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("QuantizeLinear", ["r", "s", "z"], ["rq"]),
             helper.make_node("DequantizeLinear", ["rq", "s", "z"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
                              [_init("s", np.float32(0.1)), _init("z", np.uint8(0))])
    source = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), source)
    report = optimize(source, tmp_path / "opt", quantization={"activations": "float"})
    out = ir.load(tmp_path / "opt" / "model.onnx")
    assert [v.name for v in out.graph.outputs] == ["y"] and node_types(out) == ["Relu", "Clip"]
    assert report["quantization"]["activation_pairs_removed"] == 1


# -- the optimise stage ------------------------------------------------------------------------------
@pytest.mark.parametrize("activations, removed, left", [("keep", 0, {"QuantizeLinear": 2, "DequantizeLinear": 3}),
                                                        ("float", 2, {"DequantizeLinear": 1})])
def test_the_optimise_stage_records_what_it_did(tmp_path, activations, removed, left):
    source = tmp_path / "m.onnx"
    onnx.save(qdq_conv_model(), source)
    report = optimize(source, tmp_path / "opt", quantization={"activations": activations})
    assert report["quantization"] == {"activations": activations, "activation_pairs_removed": removed,
                                      "weights_quantized": 1}
    counts = report["op_counts_after"]
    assert {op: counts.get(op) for op in left} == left
    assert ("QuantizeLinear" in counts) == (activations == "keep")
    out = ir.load(tmp_path / "opt" / "model.onnx")
    assert any(v.const_value.dtype == ir.DataType.INT8 for v in out.graph.initializers.values())
    if activations == "float":
        x = RNG.uniform(-2, 2, (1, 3, 6, 6)).astype(np.float32)
        np.testing.assert_allclose(run_reference(out, {"x": x})["y"], float_conv(x), rtol=1e-5, atol=1e-5)


# -- the recipe field ---------------------------------------------------------------------------------
RECIPE = """\
edgebuild: 1
name: demo
source:
  model: m.onnx
  inputs: {x: {shape: [1, 3, 6, 6], dtype: float32}}
target: {backend: testcopy}
"""


def _variants(tmp_path, monkeypatch, text):
    monkeypatch.chdir(tmp_path)
    onnx.save(qdq_conv_model(), tmp_path / "m.onnx")
    (tmp_path / "recipe.yaml").write_text(text)
    return {v.name: v for v in load_variants(["recipe.yaml"], None, get_registry())}


def test_activations_default_to_keep_and_a_variant_can_choose_float(tmp_path, monkeypatch):
    variants = _variants(tmp_path, monkeypatch, RECIPE + "variants:\n  qdq: {}\n  weight_only: {quantization: {activations: float}}\n")
    assert variants["qdq"].recipe.quantization.activations == "keep"
    assert variants["weight_only"].recipe.quantization.activations == "float"
    optimise = {name: next(s for s in pipeline(v, get_registry(), lambda: None) if s.name == "optimize")
                for name, v in variants.items()}
    assert optimise["qdq"].key_params()["quantization"] == {"activations": "keep"}
    assert optimise["weight_only"].key_params()["quantization"] == {"activations": "float"}  # so the stage keys differ


@pytest.mark.parametrize("text, expected", [
    (RECIPE + "quantization: {activations: int8}\n", "recipe.yaml:7:29 quantization.activations: must be one of keep, float"),
    (RECIPE + "quantization: {activation: float}\n",
     "recipe.yaml:7:16 quantization.activation: unknown key 'activation'; did you mean 'activations'?"),
    (RECIPE + "variants:\n  w: {quantization: {activations: floats}}\n",
     "recipe.yaml:8:35 quantization.activations: must be one of keep, float"),
])
def test_a_bad_value_is_located(tmp_path, monkeypatch, text, expected):
    with pytest.raises(RecipeError) as info:
        _variants(tmp_path, monkeypatch, text)
    assert expected in str(info.value), str(info.value)
    assert info.value.exit_code == 2


# -- the report -----------------------------------------------------------------------------------------
def test_the_report_says_weight_only():
    record = {"quantization": {"activations": "float", "activation_pairs_removed": 2, "weights_quantized": 1}}
    page = render_report({"recipe": "demo", "stages": [{"name": "optimize", "status": "ran"}], "optimize": record})
    assert "Quantised source" in page and "weight-only" in page and "float (weight-only)" in page

    class Done:
        info = record

    lines = detail_lines(Done())
    assert len(lines) == 1 and "weight-only: 1 quantised weights kept, 2 activation" in lines[0]


def test_a_float_model_says_nothing_about_quantisation():
    record = {"quantization": {"activations": "keep", "activation_pairs_removed": 0, "weights_quantized": 0}}
    assert "Quantised source" not in render_report({"optimize": record})

    class Done:
        info = record

    assert detail_lines(Done()) == []


def test_the_console_names_a_kept_quantised_source():
    done = SimpleNamespace(info={"quantization": {"activations": "keep", "activation_pairs_removed": 0,
                                                  "weights_quantized": 3}})
    expected = "[dim]quantised source:[/] 3 quantised weights kept; activations quantised as in the source"
    assert detail_lines(done) == [expected]
