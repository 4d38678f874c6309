"""The validation reference: the frontend's own, onnxruntime, or onnx's evaluator with the plugins' op references."""

from __future__ import annotations

import types
from dataclasses import dataclass

import numpy as np
import onnx
import pluggy
import pytest
from onnx import TensorProto, helper

from edgebuild import hookspecs
from edgebuild.custom_ops import OpReference
from edgebuild.errors import BuildError, PluginError
from edgebuild.graph import core_plugin
from edgebuild.hookspecs import hookimpl
from edgebuild.protocols import Frontend
from edgebuild.recipe.validation import ValidateSection
from edgebuild.registry import Registry
from edgebuild.verify.reference import choose_reference, ops_onnxruntime_lacks


def swish2(x, *, beta=1.0):
    return x / (1.0 + np.exp(-beta * x))


SWISH2 = OpReference("mydomain", "Swish2", reference=swish2, inputs=("X",), outputs=("Y",), attributes={"beta": 1.0})


def _plugin(**hooks) -> types.ModuleType:
    module = types.ModuleType("fake")
    for name, fn in hooks.items():
        setattr(module, name, hookimpl(fn))
    return module


def _registry(**plugins) -> Registry:
    """The core's own plugin (the ONNX frontend) and ``plugins``, each from distribution edgebuild-<name> 0.1.0."""
    pm = pluggy.PluginManager("edgebuild")
    pm.add_hookspecs(hookspecs)
    pm.register(core_plugin, name="core")
    for name, plugin in plugins.items():
        pm.register(plugin, name=name)
    registry = Registry()
    registry.collect(pm, {name: (f"edgebuild-{name}", "0.1.0") for name in plugins})
    return registry


def _lowers_swish2(register):
    register("coreml", "Swish2", lambda ctx, node: None, domain="mydomain")


def _model(tmp_path, op_domain="mydomain", op_type="Swish2", **attrs):
    """y = op(x) * 2 (a standard op after the custom one: the whole graph is evaluated)."""
    nodes = [helper.make_node(op_type, ["x"], ["s"], domain=op_domain, **attrs),
             helper.make_node("Mul", ["s", "two"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
                              [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(op_domain, 1)] if op_domain else [])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets), path)
    return path


def _choose(path, registry, reference="float32", fmt="onnx"):
    return choose_reference(path, registry, fmt=fmt, inputs={}, options=None, base_dir=path.parent,
                            section=ValidateSection(reference=reference))


X = np.linspace(-3, 3, 10, dtype=np.float32).reshape(2, 5)


def test_a_standard_graph_is_evaluated_by_onnxruntime(tmp_path):
    reference = _choose(_model(tmp_path, op_domain="", op_type="Sigmoid"), _registry())
    assert reference.name == "onnxruntime" and reference.warnings == []
    assert reference.specs["x"]["shape"] == [2, 5]
    np.testing.assert_allclose(reference.runner({"x": X})["y"], 2 / (1 + np.exp(-X)), rtol=1e-6)


def test_a_custom_op_is_evaluated_with_its_registered_reference(tmp_path):
    path = _model(tmp_path, beta=1.5)
    assert ops_onnxruntime_lacks(path) == [("mydomain", "Swish2")]
    registry = _registry(swish=_plugin(edgebuild_register_lowerings=_lowers_swish2,
                                       edgebuild_register_custom_ops=lambda register: register(
                                           "mydomain", "Swish2", SWISH2)))
    reference = _choose(path, registry)
    assert reference.name == "onnx reference evaluator + mydomain::Swish2 (edgebuild-swish 0.1.0)"
    # the node's beta, not the reference's default
    np.testing.assert_allclose(reference.runner({"x": X})["y"], 2 * swish2(X, beta=1.5), rtol=1e-6)
    assert not np.allclose(reference.runner({"x": X})["y"], 2 * swish2(X))


def test_a_kernel_declaration_with_named_tensors_is_a_reference_too(tmp_path):
    @dataclass(frozen=True)
    class Tensor:
        name: str

    @dataclass(frozen=True)
    class Kernel:  # shaped like edgebuild_msl.KernelSpec
        domain: str = "mydomain"
        op_type: str = "Swish2"
        inputs: tuple = (Tensor("X"),)
        outputs: tuple = (Tensor("Y"),)

        def run_reference(self, inputs, attrs=None):
            return {"Y": swish2(inputs["X"], **(attrs or {}))}

    registry = _registry(kernels=_plugin(edgebuild_register_custom_ops=lambda register: register(
        "mydomain", "Swish2", Kernel())))
    reference = _choose(_model(tmp_path, beta=0.5), registry)
    np.testing.assert_allclose(reference.runner({"x": X})["y"], 2 * swish2(X, beta=0.5), rtol=1e-6)


def test_edgebuilds_own_fused_ops_have_references(tmp_path):
    reference = _choose(_model(tmp_path, op_domain="edgebuild", op_type="Silu"), _registry())
    assert reference.name == "onnx reference evaluator + edgebuild::Silu (edgebuild)"
    np.testing.assert_allclose(reference.runner({"x": X})["y"], 2 * X / (1 + np.exp(-X)), rtol=1e-6)


def test_a_lowered_op_without_a_reference_names_the_op_the_plugin_and_the_ways_out(tmp_path):
    registry = _registry(swish=_plugin(edgebuild_register_lowerings=_lowers_swish2))
    with pytest.raises(BuildError) as caught:
        _choose(_model(tmp_path), registry)
    message, hint = str(caught.value), caught.value.hint
    assert "mydomain::Swish2" in message and "plugin 'swish' (edgebuild-swish 0.1.0)" in message
    assert "edgebuild_register_custom_ops" in hint and "validate.reference: none" in hint


def test_an_op_nobody_provides_is_named_too(tmp_path):
    with pytest.raises(BuildError, match="mydomain::Swish2.*no installed plugin lowers it"):
        _choose(_model(tmp_path), _registry())


def test_reference_none_runs_nothing_and_warns(tmp_path):
    reference = _choose(_model(tmp_path), _registry(swish=_plugin(edgebuild_register_lowerings=_lowers_swish2)),
                        reference="none")
    assert reference.runner is None and reference.name == "none"
    assert reference.warnings and "not compared" in reference.warnings[0]


def test_float64_of_a_custom_op_is_refused_with_a_way_out(tmp_path):
    registry = _registry(swish=_plugin(edgebuild_register_custom_ops=lambda register: register(
        "mydomain", "Swish2", SWISH2)))
    with pytest.raises(BuildError, match="float64 cannot evaluate .*mydomain::Swish2") as caught:
        _choose(_model(tmp_path), registry, reference="float64")
    assert "float32" in caught.value.hint


def test_the_frontends_own_reference_comes_first(tmp_path):
    class Eager(Frontend):
        def import_model(self, path, inputs, out_dir, *, options=None, base_dir=None):
            return {}

        def reference(self, path, inputs, options, base_dir=None):
            return lambda feed: {"y": feed["x"] * 3}

        def input_specs(self, inputs):
            return {"x": {"shape": [1], "dtype": "float32"}}

    registry = _registry(eager=_plugin(edgebuild_register_frontends=lambda register: register("eagerfmt", Eager())))
    reference = _choose(_model(tmp_path), registry, fmt="eagerfmt")  # its custom op does not matter
    assert reference.name == "eagerfmt (eager)" and reference.specs == {"x": {"shape": [1], "dtype": "float32"}}


def test_a_custom_op_without_a_reference_method_fails_at_registration():
    @dataclass
    class NoReference:
        domain: str = "mydomain"
        op_type: str = "Swish2"
        inputs: tuple = ("X",)
        outputs: tuple = ("Y",)

    registry = _registry(broken=_plugin(edgebuild_register_custom_ops=lambda register: register(
        "mydomain", "Swish2", NoReference())))
    with pytest.raises(PluginError, match="custom op 'mydomain::Swish2' without run_reference"):
        registry.get("custom_ops", ("mydomain", "Swish2"))


def test_an_op_reference_refuses_attributes_it_does_not_declare():
    with pytest.raises(ValueError, match="unknown attribute.*alpha"):
        SWISH2.run_reference({"X": X}, {"alpha": 1.0})


def test_ops_in_subgraphs_count_and_a_models_own_functions_do_not(tmp_path):
    branch = helper.make_graph([helper.make_node("Swish2", ["x"], ["b"], domain="mydomain")], "then", [],
                               [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 5])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["c"])], "else", [],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 5])])
    function = helper.make_function("mylocal", "Twice", ["X"], ["Y"], [helper.make_node("Add", ["X", "X"], ["Y"])],
                                    [helper.make_opsetid("", 17)])
    nodes = [helper.make_node("If", ["flag"], ["a"], then_branch=branch, else_branch=other),
             helper.make_node("Twice", ["a"], ["y"], domain="mylocal")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5]),
                                           helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, functions=[function], opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("mydomain", 1), helper.make_opsetid("mylocal", 1)]), path)
    assert ops_onnxruntime_lacks(path) == [("mydomain", "Swish2")]
