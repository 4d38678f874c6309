"""A lowering that exists but declines a node's form says so: the node, the attribute, operand or
shape, the reason, and a hint that fits (not "no Core ML lowering ... add a lowering in a plugin")."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest
from onnx_cases import IR_VERSION, coreml_registry
from test_converter import registry_with

from edgebuild.plugin.graph import declined_reason, mark_declined
from edgebuild_coreml.lowering.converter import UnsupportedOps, convert
from edgebuild_coreml.lowering.errors import DeclinedForm, declines

F, I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64


def model_of(nodes, inputs, outputs, initializers=(), opset=18, extra_opsets=()):
    graph = oh.make_graph(nodes, "g", inputs, outputs, list(initializers))
    opsets = [oh.make_opsetid("", opset)] + [oh.make_opsetid(d, 1) for d in extra_opsets]
    return oh.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)


def tensor(name, dtype=F, shape=None):
    return oh.make_tensor_value_info(name, dtype, shape)


def lower(proto, registry=None, **kwargs):
    return convert(ir.serde.deserialize_model(proto), registry=registry or coreml_registry(), **kwargs)


def declined(proto, **kwargs) -> DeclinedForm:
    with pytest.raises(DeclinedForm) as caught:
        lower(proto, **kwargs)
    error = caught.value
    assert "no Core ML lowering" not in str(error) and "add a lowering in a plugin" not in str(error)
    assert "declines this form" in error.message and "not for this form" in error.hint
    return error


# -- declines inside a lowering: one case per kind of form ------------------------------------------

def _one_hot_nodes(name: str):
    """OneHot whose depth is the class count read off the logits' shape (dim 1, left symbolic)."""
    return [oh.make_node("Shape", ["logits"], [f"{name}_shape"], start=1, end=2),
            oh.make_node("OneHot", ["labels", f"{name}_shape", "on_off"], [f"{name}_out"], name=name, axis=-1)]


ON_OFF = oh.make_tensor("on_off", F, [2], [0.0, 1.0])


def test_an_operand_from_the_shape_of_an_unfixed_input_names_the_operand_and_the_dim():
    proto = model_of(
        _one_hot_nodes("n"), [tensor("logits", F, [2, "C"]), tensor("labels", I64, [2])], [tensor("n_out")], [ON_OFF],
    )
    error = declined(proto)
    assert error.message.startswith("node 'n' (OneHot): the Core ML lowering declines this form: depth must be a "
                                    "constant known at build time")
    assert "Shape of the input 'logits', whose dim 1 is not fixed" in error.message
    assert "pin the input shapes" in error.hint
    assert (error.node, error.op_type) == ("n", "OneHot")


def test_resize_to_run_time_sizes_with_antialias_names_the_attribute():
    """Run-time sizes lower through a sampling grid built in the graph; antialias there does not."""
    proto = model_of(
        [oh.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="up", mode="linear", antialias=1)],
        [tensor("x", F, [1, 1, 2, 2]), tensor("sizes", I64, [4])], [tensor("y")],
    )
    error = declined(proto)
    assert "node 'up' (Resize)" in error.message and "antialias" in error.message


def test_ceil_mode_pooling_of_a_flexible_size_names_the_attribute():
    proto = model_of(
        [oh.make_node("MaxPool", ["x"], ["y"], name="pool", kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)],
        [tensor("x", F, [1, 3, "H", "W"])], [tensor("y")],
    )
    error = declined(proto)
    assert "node 'pool' (MaxPool)" in error.message and "ceil_mode" in error.message and "flexible" in error.message


def test_group_normalization_of_an_unknown_shape_says_it_needs_one():
    proto = model_of(
        [oh.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], name="gn", num_groups=2)],
        [tensor("x", F, ["N", 4, "L"])], [tensor("y")],
        [oh.make_tensor("scale", F, [4], np.ones(4)), oh.make_tensor("bias", F, [4], np.zeros(4))], opset=21,
    )
    assert "needs static input shapes" in declined(proto).message


def test_an_unrolled_lstm_of_an_unknown_sequence_length_names_what_made_it_unrolled():
    hidden, size = 3, 2
    rng = np.random.default_rng(0)
    w = rng.standard_normal((1, 4 * hidden, size)).astype(np.float32)
    r = rng.standard_normal((1, 4 * hidden, hidden)).astype(np.float32)
    proto = model_of(
        [oh.make_node("LSTM", ["x", "W", "R"], ["y"], name="lstm", hidden_size=hidden, clip=0.5)],
        [tensor("x", F, ["T", 1, size])], [tensor("y")],
        [oh.make_tensor("W", F, w.shape, w.ravel()), oh.make_tensor("R", F, r.shape, r.ravel())],
    )
    error = declined(proto)
    assert "node 'lstm' (LSTM)" in error.message and "static sequence length" in error.message


def test_a_cast_to_a_type_core_ml_lacks_names_the_type():
    proto = model_of([oh.make_node("Cast", ["x"], ["y"], name="to_c64", to=onnx.TensorProto.COMPLEX64)],
                     [tensor("x", F, [2])], [tensor("y", onnx.TensorProto.COMPLEX64)])
    error = declined(proto)
    assert "node 'to_c64' (Cast)" in error.message and "COMPLEX64" in error.message


def test_a_plugin_lowering_that_declines_names_the_plugin():
    def frob(ctx, node):
        ctx.decline(node, f"mode {ctx.attr(node, 'mode')!r} is not supported (only 'fast')")

    proto = model_of([oh.make_node("Frob", ["x"], ["y"], name="f", domain="acme", mode="slow")],
                     [tensor("x", F, [2])], [tensor("y")], extra_opsets=["acme"])
    error = declined(proto, registry=registry_with(acme__Frob=frob))
    assert error.message.startswith("node 'f' (acme::Frob): the lowering from plugin 'test-ops' (test-ops 0) "
                                    "declines this form: mode 'slow' is not supported")


def test_a_decline_inside_a_loop_body_names_the_inner_node_once():
    body = oh.make_graph(
        [*_one_hot_nodes("inner"), oh.make_node("Identity", ["cond"], ["cond_out"])],
        "body", [tensor("iter", I64, []), tensor("cond", onnx.TensorProto.BOOL, [])],
        [tensor("cond_out", onnx.TensorProto.BOOL, []), tensor("inner_out")],
    )
    proto = model_of(
        [oh.make_node("Loop", ["trips", ""], ["rows"], name="loop", body=body)],
        [tensor("logits", F, [2, "C"]), tensor("labels", I64, [2]), tensor("trips", I64, [])], [tensor("rows")],
        [ON_OFF],
    )
    error = declined(proto)
    assert error.message.startswith("node 'inner' (OneHot): the Core ML lowering declines this form")
    assert error.message.count("declines this form") == 1


# -- declines found before lowering: support checks and pass marks, all in one error ------------------

def _frob_with_a_check():
    @declines(lambda node: None if node.attributes["mode"].value == "fast" else
              f"mode {node.attributes['mode'].value!r} is not supported (only 'fast')")
    def frob(ctx, node):
        from coremltools.converters.mil import Builder as mb

        return mb.identity(x=ctx.input(node, 0), name=ctx.name(node))

    return frob


def test_support_checks_name_every_declined_node_and_missing_ops_apart():
    nodes = [oh.make_node("Frob", ["x"], ["a"], name="f1", domain="acme", mode="slow"),
             oh.make_node("Frob", ["a"], ["b"], name="f2", domain="acme", mode="fast"),
             oh.make_node("Frob", ["b"], ["c"], name="f3", domain="acme", mode="odd"),
             oh.make_node("Missing", ["c"], ["y"], name="m", domain="acme")]
    proto = model_of(nodes, [tensor("x", F, [2])], [tensor("y")], extra_opsets=["acme"])
    with pytest.raises(UnsupportedOps) as caught:
        lower(proto, registry=registry_with(acme__Frob=_frob_with_a_check()))
    error = caught.value
    lines = error.message.splitlines()
    assert lines[0] == "2 node(s) have a Core ML lowering that declines their form:"
    assert "node 'f1' (acme::Frob): the Core ML lowering declines this form: mode 'slow'" in lines[1]
    assert "node 'f3' (acme::Frob)" in lines[2] and "'odd'" in lines[2]
    assert lines[3] == "1 op type(s) have no Core ML lowering:" and "acme::Missing" in lines[4]
    assert "f2" not in error.message
    assert "not for this form" in error.hint and "add a lowering in a plugin" in error.hint
    assert [d["node"] for d in error.declined] == ["f1", "f3"]


def test_a_supported_form_passes_its_check_and_lowers():
    proto = model_of([oh.make_node("Frob", ["x"], ["y"], name="f", domain="acme", mode="fast")],
                     [tensor("x", F, [2])], [tensor("y")], extra_opsets=["acme"])
    result = lower(proto, registry=registry_with(acme__Frob=_frob_with_a_check()))
    assert "identity" in result.op_counts


def test_a_node_a_pass_declined_names_the_pass_reason_not_a_missing_lowering():
    proto = model_of([oh.make_node("Unrolled", ["x"], ["y"], name="q", domain="acme"),
                      oh.make_node("Other", ["y"], ["z"], name="o", domain="acme")],
                     [tensor("x", F, [2])], [tensor("z")], extra_opsets=["acme"])
    model = ir.serde.deserialize_model(proto)
    mark_declined(model.graph.node(0), "direction 'reverse' is not decomposed")
    # the mark is node metadata: it survives the stage file between optimise and lower
    model = ir.serde.deserialize_model(ir.serde.serialize_model(model))
    assert declined_reason(model.graph.node(0)) == "direction 'reverse' is not decomposed"
    assert declined_reason(model.graph.node(1)) is None
    with pytest.raises(UnsupportedOps) as caught:
        convert(model, registry=coreml_registry())
    message = caught.value.message
    assert ("node 'q' (acme::Unrolled): no Core ML lowering for this form: the graph pass that rewrites the op "
            "declined it: direction 'reverse' is not decomposed") in message
    assert "acme::Other (opset 1): 1 node(s), e.g. o" in message and "acme::Unrolled (opset" not in message


def test_a_mark_on_an_op_that_has_a_lowering_changes_nothing():
    proto = model_of([oh.make_node("Relu", ["x"], ["y"], name="r")], [tensor("x", F, [2])], [tensor("y")])
    model = ir.serde.deserialize_model(proto)
    mark_declined(model.graph.node(0), "not this pass's form")
    assert "relu" in convert(model, registry=coreml_registry()).op_counts


# -- every declined node in one error, for run and plan -----------------------------------------------

def _two_declined_forms():
    """A ceil_mode MaxPool over flexible sizes (and a Relu reading it) and an antialiased Resize to
    run-time sizes."""
    return model_of(
        [oh.make_node("MaxPool", ["img"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
         oh.make_node("Relu", ["p"], ["y"], name="after_pool"),
         oh.make_node("Resize", ["img", "", "", "sizes"], ["z"], name="resize", mode="linear", antialias=1)],
        [tensor("img", F, [1, 3, "H", "W"]), tensor("sizes", I64, [4])], [tensor("y"), tensor("z")],
    )


def test_the_walk_goes_on_past_a_declined_node_and_names_every_one():
    with pytest.raises(UnsupportedOps) as caught:
        lower(_two_declined_forms())
    error = caught.value
    lines = error.message.splitlines()
    assert lines[0] == "2 node(s) have a Core ML lowering that declines their form:"
    assert "node 'pool' (MaxPool): the Core ML lowering declines this form: ceil_mode" in lines[1]
    assert "node 'resize' (Resize): the Core ML lowering declines this form" in lines[2] and "antialias" in lines[2]
    assert "after_pool" not in error.message  # it reads the declined pool's output: not lowered, not named
    assert [(d["node"], d["op_type"]) for d in error.declined] == [("pool", "MaxPool"), ("resize", "Resize")]
    assert error.hint.count("pin the") == 2 and error.hint.endswith("see docs/plugins.md)")
    assert "add a lowering in a plugin" not in error.hint


def test_plan_names_every_declined_node(tmp_path, capsys):
    import onnx as onnx_lib
    from edgebuild_testplugin.cli_runner import run_in_process

    onnx_lib.save(_two_declined_forms(), tmp_path / "two.onnx")
    recipe = tmp_path / "two.yaml"
    recipe.write_text(
        "edgebuild: 1\nname: two\n"
        "source:\n  model: two.onnx\n  inputs: {img: {shape: [1, 3, {range: [4, 16]}, {range: [4, 16]}], "
        "dtype: float32}, sizes: {shape: [4], dtype: int64}}\n"
        "target: {backend: coreml, deployment_target: iOS17, precision: float32}\noutputs: {dir: out}\n"
    )
    code, out, err = run_in_process(capsys, "plan", recipe, "--cache-dir", tmp_path / "cache", "--json")
    assert code == 1, err
    message = json.loads(out)["error"]["message"]
    assert "node 'pool' (MaxPool)" in message and "node 'resize' (Resize)" in message
    assert "declines their form" in message and "no Core ML lowering" not in message


def test_a_form_the_optimize_stage_left_is_named_by_the_build(tmp_path, capsys):
    """A DynamicQuantizeLSTM whose recurrent weights come in at run time: the decomposition pass
    leaves it marked, the mark crosses the stage files, and the lower stage's error gives its reason."""
    import onnx as onnx_lib
    import onnx.numpy_helper as onh
    from edgebuild_testplugin.cli_runner import run_in_process

    rng = np.random.default_rng(0)
    hidden, features = 3, 4
    node = oh.make_node("DynamicQuantizeLSTM", ["x", "w", "r", "", "", "", "", "", "ws", "wz", "rs", "rz"], ["y"],
                        name="qlstm", domain="com.microsoft", hidden_size=hidden)
    inits = [onh.from_array(rng.integers(-127, 128, (1, features, 4 * hidden)).astype(np.int8), "w"),
             onh.from_array(np.full(1, 0.01, np.float32), "ws"), onh.from_array(np.zeros(1, np.int8), "wz"),
             onh.from_array(np.full(1, 0.01, np.float32), "rs"), onh.from_array(np.zeros(1, np.int8), "rz")]
    proto = model_of([node], [tensor("x", F, [5, 1, features]), tensor("r", onnx_lib.TensorProto.INT8, [1, hidden, 4 * hidden])],
                     [tensor("y")], inits, extra_opsets=["com.microsoft"])
    onnx_lib.save(proto, tmp_path / "qlstm.onnx")
    recipe = tmp_path / "qlstm.yaml"
    recipe.write_text("edgebuild: 1\nname: qlstm\nsource: {model: qlstm.onnx}\n"
                      "target: {backend: coreml, deployment_target: iOS17, precision: float32}\noutputs: {dir: out}\n")
    code, out, err = run_in_process(capsys, "run", recipe, "--cache-dir", tmp_path / "cache", "--json")
    [variant] = json.loads(out)["variants"]
    assert code == 1 and variant["status"] == "failed", err
    assert ("node 'qlstm' (com.microsoft::DynamicQuantizeLSTM): no Core ML lowering for this form: the graph pass "
            "that rewrites the op declined it: ") in variant["error"]
    assert "input R is computed at run time" in variant["error"] and "add a lowering in a plugin" not in variant["error"]
