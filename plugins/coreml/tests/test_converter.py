"""The ONNX -> MIL converter and .mlpackage packaging."""

from __future__ import annotations

import re

import coremltools as ct
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnx_ir as ir
import pluggy
import pytest
from coremltools.converters.mil import Builder as mb
from onnx_cases import IR_VERSION, check, coreml_registry, lower, lower_and_run, run_onnxruntime

from edgebuild import hookspecs
from edgebuild import progress
from edgebuild.errors import BuildError, UsageError
from edgebuild.registry import Registry
from edgebuild_coreml import plugin as coreml_plugin
from edgebuild_coreml.lowering.converter import convert, sanitize_name
from edgebuild_coreml.lowering.errors import LoweringError

F = onnx.TensorProto.FLOAT
I64 = onnx.TensorProto.INT64


def model_of(nodes, inputs, outputs, initializers=(), opset=18, extra_opsets=()):
    graph = oh.make_graph(nodes, "g", inputs, outputs, list(initializers))
    opsets = [oh.make_opsetid("", opset)] + [oh.make_opsetid(d, 1) for d in extra_opsets]
    return oh.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)


def registry_with(**lowerings):
    """The coreml plugin plus a test plugin registering ``{"domain::Op": fn}`` lowerings."""

    class TestPlugin:
        @staticmethod
        @hookspecs.hookimpl
        def edgebuild_register_lowerings(register):
            for key, fn in lowerings.items():
                domain, op_type = key.split("__")
                register("coreml", op_type, fn, domain=domain)

    manager = pluggy.PluginManager("edgebuild")
    manager.add_hookspecs(hookspecs)
    manager.register(coreml_plugin, name="coreml")
    manager.register(TestPlugin, name="test-ops")
    registry = Registry()
    registry.collect(manager, {"coreml": ("edgebuild-coreml", "0"), "test-ops": ("test-ops", "0")})
    return registry


# -- unsupported ops ----------------------------------------------------------------------
def test_unsupported_ops_are_listed_all_at_once():
    x = oh.make_tensor_value_info("x", F, [2, 3])
    nodes = [
        oh.make_node("Frobnicate", ["x"], ["a"], name="frob1", domain="acme"),
        oh.make_node("Frobnicate", ["a"], ["b"], name="frob2", domain="acme"),
        oh.make_node("Relu", ["b"], ["c"], name="relu"),
        oh.make_node("StringNormalizer", ["c"], ["y"], name="strnorm"),
    ]
    model = ir.serde.deserialize_model(model_of(nodes, [x], [oh.make_tensor_value_info("y", F, [2, 3])], extra_opsets=["acme"]))
    with pytest.raises(BuildError) as info:
        convert(model, registry=coreml_registry())
    message = str(info.value)
    assert "2 op type(s)" in message
    assert "acme::Frobnicate (opset 1): 2 node(s), e.g. frob1, frob2" in message
    assert "StringNormalizer (opset 18): 1 node(s), e.g. strnorm" in message
    assert "Relu" not in message.split("hint")[0]
    assert "edgebuild_register_lowerings" in message and "docs/plugins.md" in message


def test_unsupported_ops_inside_subgraphs_are_found():
    then_branch = oh.make_graph(
        [oh.make_node("Frobnicate", ["x"], ["t"], name="inner", domain="acme")], "then", [],
        [oh.make_tensor_value_info("t", F, [2])],
    )
    else_branch = oh.make_graph([oh.make_node("Identity", ["x"], ["e"])], "else", [], [oh.make_tensor_value_info("e", F, [2])])
    node = oh.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch, name="branch")
    model = model_of(
        [node],
        [oh.make_tensor_value_info("c", onnx.TensorProto.BOOL, []), oh.make_tensor_value_info("x", F, [2])],
        [oh.make_tensor_value_info("y", F, [2])],
        extra_opsets=["acme"],
    )
    with pytest.raises(BuildError, match=r"acme::Frobnicate \(opset 1\): 1 node\(s\), e.g. inner"):
        convert(ir.serde.deserialize_model(model), registry=coreml_registry())


# -- names, dtypes, constants -------------------------------------------------------------
def test_sanitize_name_gives_unique_identifiers():
    taken: set[str] = set()
    names = [sanitize_name(n, taken) for n in ["input:0", "input/0", "1st", "", "ok"]]
    assert names == ["input_0", "input_0_2", "v_1st", "value", "ok"]
    assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n) for n in names)


def test_names_are_sanitised_and_mapped_back():
    nodes = [
        oh.make_node("Relu", ["input:0"], ["hidden.1"]),
        oh.make_node("Add", ["hidden.1", "input:0"], ["2/out"]),
        oh.make_node("Neg", ["hidden.1"], ["out-b"]),
    ]
    model = model_of(
        nodes, [oh.make_tensor_value_info("input:0", F, [2, 3])],
        [oh.make_tensor_value_info("2/out", F, [2, 3]), oh.make_tensor_value_info("out-b", F, [2, 3])],
    )
    result = lower(model)
    assert result.input_names == {"input:0": "input_0"}
    assert result.output_names == {"2/out": "v_2_out", "out-b": "out_b"}
    function = result.program.functions["main"]
    assert list(function.inputs) == ["input_0"]
    assert [v.name for v in function.outputs] == ["v_2_out", "out_b"]
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    check(model, {"input:0": x})


def test_int64_inputs_become_int32_and_match():
    nodes = [oh.make_node("Add", ["a", "k"], ["s"]), oh.make_node("Mul", ["s", "a"], ["y"])]
    model = model_of(
        nodes, [oh.make_tensor_value_info("a", I64, [4])], [oh.make_tensor_value_info("y", I64, [4])],
        initializers=[onh.from_array(np.array([1, -2, 3, 40000], np.int64), "k")],
    )
    result = lower(model)
    assert result.input_dtypes == {"a": "int32"}
    assert result.program.functions["main"].inputs["a"].dtype == ct.converters.mil.mil.types.int32
    out = check(model, {"a": np.array([5, -6, 7, 8], np.int64)})
    assert out["y"].dtype == np.int32


def test_int64_constant_outside_int32_names_the_node():
    model = model_of(
        [oh.make_node("Add", ["a", "k"], ["y"], name="add_big")], [oh.make_tensor_value_info("a", I64, [1])],
        [oh.make_tensor_value_info("y", I64, [1])], initializers=[onh.from_array(np.array([2**40], np.int64), "k")],
    )
    with pytest.raises(LoweringError, match=r"'add_big' \(Add\).*outside int32"):
        lower(model)


def test_bool_and_scalar_inputs():
    nodes = [oh.make_node("Where", ["c", "a", "b"], ["y"])]
    model = model_of(
        nodes,
        [oh.make_tensor_value_info("c", onnx.TensorProto.BOOL, [3]), oh.make_tensor_value_info("a", F, []),
         oh.make_tensor_value_info("b", F, [3])],
        [oh.make_tensor_value_info("y", F, [3])],
    )
    result = lower(model)
    assert result.input_dtypes["c"] == "int32" and result.input_shapes["a"] == (1,)
    check(model, {"c": np.array([True, False, True]), "a": np.array(2.5, np.float32), "b": np.arange(3, dtype=np.float32)})


def test_constant_nodes_and_initializer_inputs_fold():
    const = oh.make_node("Constant", [], ["shape"], value=onh.from_array(np.array([3, 2], np.int64)))
    reshape = oh.make_node("Reshape", ["x", "shape"], ["r"])
    scale = oh.make_node("Constant", [], ["s"], value_float=2.0)
    mul = oh.make_node("Mul", ["r", "s"], ["y"])
    model = model_of([const, reshape, scale, mul], [oh.make_tensor_value_info("x", F, [2, 3])], [oh.make_tensor_value_info("y", F, [3, 2])])
    result = lower(model)
    assert result.op_counts.get("reshape") == 1 and result.op_counts.get("mul") == 1
    check(model, {"x": np.arange(6, dtype=np.float32).reshape(2, 3)})


def test_symbolic_input_dims_share_symbols_and_run():
    nodes = [oh.make_node("Add", ["a", "b"], ["y"])]
    model = model_of(
        nodes, [oh.make_tensor_value_info("a", F, ["N", 3]), oh.make_tensor_value_info("b", F, ["N", 3])],
        [oh.make_tensor_value_info("y", F, ["N", 3])],
    )
    result = lower(model)
    inputs = result.program.functions["main"].inputs
    assert inputs["a"].shape[0] == inputs["b"].shape[0] and not isinstance(inputs["a"].shape[0], int)
    assert result.input_shapes["a"] == (None, 3)
    x = np.ones((5, 3), np.float32)
    np.testing.assert_allclose(lower_and_run(model, {"a": x, "b": 2 * x})["y"], 3 * x)


def test_input_shapes_override_pins_dims():
    model = model_of([oh.make_node("Relu", ["x"], ["y"])], [oh.make_tensor_value_info("x", F, ["N", 3])], [oh.make_tensor_value_info("y", F, ["N", 3])])
    result = convert(ir.serde.deserialize_model(model), registry=coreml_registry(), input_shapes={"x": [4, 3]})
    assert result.program.functions["main"].inputs["x"].shape == (4, 3)


def test_lowering_exceptions_name_the_node():
    def broken(ctx, node):
        raise ValueError("boom")

    model = model_of(
        [oh.make_node("Broken", ["x"], ["y"], name="the_node", domain="acme")],
        [oh.make_tensor_value_info("x", F, [2])], [oh.make_tensor_value_info("y", F, [2])], extra_opsets=["acme"],
    )
    with pytest.raises(LoweringError, match=r"node 'the_node' \(acme::Broken\): the lowering from plugin 'test-ops' "
                                            r"\(test-ops 0\) failed: ValueError: boom"):
        convert(ir.serde.deserialize_model(model), registry=registry_with(acme__Broken=broken))


def test_target_gating_error_keeps_its_class():
    x = np.zeros((2, 3, 4), np.float32)
    from onnx_cases import single_node_model

    model = single_node_model("GatherND", {"x": x, "i": np.array([[1], [2]], np.int64)}, attrs={"batch_dims": 1})
    from edgebuild_coreml.lowering.errors import TargetTooOld

    with pytest.raises(TargetTooOld, match="iOS16"):
        lower(model, target="iOS15")


def test_third_party_lowering_with_a_subgraph_sees_outer_values():
    """lower_subgraph lowers a nested graph in the current block with outer values visible."""

    def apply_body(ctx, node):
        body = node.attributes["body"].value
        (result,) = ctx.lower_subgraph(body, [ctx.input(node, 0)])
        return mb.identity(x=result, name=ctx.name(node))

    body = oh.make_graph(
        [oh.make_node("Mul", ["v", "outer"], ["m"]), oh.make_node("Add", ["m", "v"], ["out"])], "body",
        [oh.make_tensor_value_info("v", F, [3])], [oh.make_tensor_value_info("out", F, [3])],
    )
    nodes = [
        oh.make_node("Neg", ["x"], ["outer"]),
        oh.make_node("Apply", ["x"], ["y"], domain="acme", body=body),
    ]
    model = model_of(nodes, [oh.make_tensor_value_info("x", F, [3])], [oh.make_tensor_value_info("y", F, [3])], extra_opsets=["acme"])
    result = convert(ir.serde.deserialize_model(model), registry=registry_with(acme__Apply=apply_body))
    from edgebuild_coreml.interpreter import run_program

    x = np.array([1.0, -2.0, 3.0], np.float32)
    y = run_program(result.program, {"x": x})["y"]
    np.testing.assert_allclose(y, x * -x + x)


# -- progress -----------------------------------------------------------------------------
def test_lowering_reports_each_op():
    graph = oh.make_graph([oh.make_node("Relu", ["x"], ["a"]), oh.make_node("Neg", ["a"], ["b"]),
                           oh.make_node("Abs", ["b"], ["y"])], "g",
                          [oh.make_tensor_value_info("x", F, [1, 4])], [oh.make_tensor_value_info("y", F, [1, 4])])
    model = ir.serde.deserialize_model(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))
    seen = []
    with progress.reporting(lambda step, done, total: seen.append((step, done, total))):
        convert(model, precision="float32")
    assert seen == [("ops lowered", k, 3) for k in (1, 2, 3)]


# -- packaging ----------------------------------------------------------------------------
def _two_op_model():
    nodes = [oh.make_node("Mul", ["x", "x"], ["sq"], name="square"), oh.make_node("Add", ["sq", "x"], ["y"], name="plus")]
    return model_of(nodes, [oh.make_tensor_value_info("x", F, ["N", 3])], [oh.make_tensor_value_info("y", F, ["N", 3])])


def test_mlpackage_saved_with_metadata_and_read_back(tmp_path):
    from edgebuild_coreml.lowering.package import save_mlpackage

    result = lower(_two_op_model())
    path = tmp_path / "out" / "model.mlpackage"
    metadata = {"source_sha256": "ab" * 32, "recipe": "recipes/demo.yaml", "variant": "fp16",
                "author": "edgebuild tests", "license": "MIT", "short_description": "square plus x"}
    save_mlpackage(result, path, target="iOS17", precision="float16", input_specs={"x": [[1, 8], 3]}, metadata=metadata)
    # overwrite in place: the second save replaces the first, leaving no staging dirs behind
    save_mlpackage(result, path, target="iOS17", precision="float32", input_specs={"x": [[1, 8], 3]}, metadata=metadata)
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.mlpackage"]

    model = ct.models.MLModel(str(path), skip_model_load=True)
    assert model.user_defined_metadata["source_sha256"] == "ab" * 32
    assert model.user_defined_metadata["variant"] == "fp16"
    assert model.user_defined_metadata["edgebuild_coreml_version"]
    assert model.author == "edgebuild tests" and model.license == "MIT"
    spec = ct.utils.load_spec(str(path))
    (inp,) = spec.description.input
    assert inp.name == "x"
    ranges = inp.type.multiArrayType.shapeRange.sizeRanges
    assert (ranges[0].lowerBound, ranges[0].upperBound) == (1, 8)
    assert [o.name for o in spec.description.output] == ["y"]


def test_fp16_keep_fp32_leaves_named_ops_in_fp32(tmp_path):
    from edgebuild_coreml.lowering.package import save_mlpackage

    result = lower(_two_op_model())
    model = save_mlpackage(
        result, tmp_path / "m.mlpackage", target="iOS17", precision="float16",
        input_specs={"x": [2, 3]}, metadata={}, keep_fp32={"square"},
    )
    ops = {op.name: op for op in model._mil_program.functions["main"].operations}
    fp32 = ct.converters.mil.mil.types.fp32
    fp16 = ct.converters.mil.mil.types.fp16
    assert ops["square"].outputs[0].dtype == fp32
    assert any(op.op_type == "add" and op.outputs[0].dtype == fp16 for op in ops.values())


def test_unbounded_dynamic_input_is_a_usage_error(tmp_path):
    from edgebuild_coreml.lowering.package import save_mlpackage

    with pytest.raises(UsageError, match=r"input 'x' dim 0 .*bounded range"):
        save_mlpackage(lower(_two_op_model()), tmp_path / "m.mlpackage", target="iOS17", precision="float32", metadata={})


def test_enumerated_shapes(tmp_path):
    from edgebuild_coreml.lowering.package import save_mlpackage

    save_mlpackage(
        lower(_two_op_model()), tmp_path / "m.mlpackage", target="iOS17", precision="float32",
        input_specs={"x": {"shapes": [[1, 3], [4, 3]]}}, metadata={},
    )
    spec = ct.utils.load_spec(str(tmp_path / "m.mlpackage"))
    shapes = spec.description.input[0].type.multiArrayType.enumeratedShapes.shapes
    assert [list(s.shape) for s in shapes] == [[1, 3], [4, 3]]


def test_onnxruntime_reference_helper_runs():
    model = _two_op_model()
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(run_onnxruntime(model, {"x": x})["y"], 2 * x)
