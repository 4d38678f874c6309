"""LSTM, GRU, RNN, Loop and If lowerings against onnxruntime and the ONNX backend node cases
(lowering/ops/rnn.py, loop.py, control.py).

Each case lowers a small ONNX model to MIL, runs it in edgebuild's MIL interpreter and
compares with onnxruntime (or, for layout=1, which onnxruntime lacks, with the time-major
model on transposed data).
"""

from __future__ import annotations

import importlib
import re

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest
from onnx_cases import (
    IR_VERSION,
    assert_matches,
    check,
    check_op,
    lower,
    lower_and_run,
    rand,
    run_onnxruntime,
    single_node_model,
)

from edgebuild.errors import BuildError

RTOL, ATOL = 1e-4, 1e-5
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
OUTPUTS = {"LSTM": 3, "GRU": 2, "RNN": 2}
WEIGHTS = ("w", "r", "b", "p")


def recurrent_inputs(op, direction="forward", *, steps=4, batch=3, features=3, hidden=5, layout=0, lengths=None,
                     peepholes=False):
    d = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    state = (d, batch, hidden) if layout == 0 else (batch, d, hidden)
    inputs = {
        "x": rand(*((steps, batch, features) if layout == 0 else (batch, steps, features)), low=-2.0, high=2.0),
        "w": rand(d, g * hidden, features, seed=1), "r": rand(d, g * hidden, hidden, seed=2),
        "b": rand(d, 2 * g * hidden, seed=3), "seq": lengths, "h0": rand(*state, seed=4),
    }
    if op == "LSTM":
        inputs.update(c0=rand(*state, seed=5), p=rand(d, 3 * hidden, seed=6) if peepholes else None)
    return inputs


def check_recurrent(op, inputs, attrs, *, constants=WEIGHTS):
    model = single_node_model(op, inputs, attrs={"hidden_size": 5, **attrs}, opset=14, outputs=OUTPUTS[op],
                              initializers=[k for k in constants if k in inputs])
    check(model, inputs, initializers=[k for k in constants if k in inputs], rtol=RTOL, atol=ATOL)
    return lower(model).op_counts


DIRECTIONS = ["forward", "reverse", "bidirectional"]


# -- the common case: MIL's fused ops -----------------------------------------------------
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("op", ["GRU", "RNN", "LSTM"])
def test_constant_weights_use_the_fused_mil_op(op, direction):
    counts = check_recurrent(op, recurrent_inputs(op, direction), {"direction": direction})
    assert counts.get(op.lower(), 0) >= 1
    assert "matmul" not in counts


@pytest.mark.parametrize("target", ["iOS15", "iOS18"])
@pytest.mark.parametrize("op", ["GRU", "RNN", "LSTM"])
def test_fused_without_initial_states(op, target):
    inputs = {**recurrent_inputs(op, "bidirectional"), "h0": None}
    if op == "LSTM":
        inputs["c0"] = None
    model = single_node_model(op, inputs, attrs={"hidden_size": 5, "direction": "bidirectional"}, opset=14,
                              outputs=OUTPUTS[op], initializers=["w", "r", "b"])
    check(model, inputs, initializers=["w", "r", "b"], rtol=RTOL, atol=ATOL, target=target)
    assert lower(model, target=target).op_counts.get(op.lower(), 0) >= 1


@pytest.mark.parametrize("constants", [WEIGHTS, ()], ids=["fused", "unrolled"])
def test_float16_precision(constants):
    inputs = recurrent_inputs("GRU", "bidirectional")
    model = single_node_model("GRU", inputs, attrs={"hidden_size": 5, "direction": "bidirectional"}, opset=14,
                              outputs=2, initializers=[k for k in constants if k in inputs])
    feeds = {k: v for k, v in inputs.items() if v is not None and k not in constants}
    expected = run_onnxruntime(model, feeds)
    actual = lower_and_run(model, feeds, precision="float16")
    for name, reference in expected.items():
        assert_matches(actual[name], reference, rtol=2e-2, atol=2e-2, name=name)


@pytest.mark.parametrize("activation", ["Relu", "Sigmoid", "Tanh"])
def test_rnn_activations_fused(activation):
    counts = check_recurrent("RNN", recurrent_inputs("RNN"), {"activations": [activation]})
    assert counts.get("rnn") == 1


# -- runtime weights and options the fused ops lack: unrolled -----------------------------
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("op", ["GRU", "RNN", "LSTM"])
def test_runtime_weights_unroll(op, direction):
    counts = check_recurrent(op, recurrent_inputs(op, direction, peepholes=True), {"direction": direction},
                             constants=())
    assert op.lower() not in counts and counts.get("matmul", 0) >= 4


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_gru_linear_before_reset(direction):
    counts = check_recurrent("GRU", recurrent_inputs("GRU", direction),
                             {"direction": direction, "linear_before_reset": 1})
    assert "gru" not in counts


def test_gru_linear_before_reset_runtime_bias():
    check_recurrent("GRU", recurrent_inputs("GRU", "bidirectional"),
                    {"direction": "bidirectional", "linear_before_reset": 1}, constants=())


@pytest.mark.parametrize("op", ["GRU", "RNN", "LSTM"])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_clip_bounds_every_gate_input(op, direction):
    check_recurrent(op, recurrent_inputs(op, direction, peepholes=True), {"direction": direction, "clip": 0.3})


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_lstm_input_forget(direction):
    check_recurrent("LSTM", recurrent_inputs("LSTM", direction, peepholes=True),
                    {"direction": direction, "input_forget": 1})


@pytest.mark.parametrize("lengths", [[4, 2, 1], [1, 3, 4], [4, 0, 2]], ids=str)
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("op", ["GRU", "RNN", "LSTM"])
def test_sequence_lengths(op, direction, lengths):
    inputs = recurrent_inputs(op, direction, lengths=np.array(lengths, np.int32))
    check_recurrent(op, inputs, {"direction": direction})


@pytest.mark.parametrize("op", ["GRU", "LSTM"])
def test_runtime_sequence_lengths(op):
    inputs = recurrent_inputs(op, "bidirectional", lengths=np.array([3, 0, 4], np.int32))
    check_recurrent(op, inputs, {"direction": "bidirectional"}, constants=("w", "r", "b"))


def test_full_sequence_lengths_keep_the_fused_op():
    inputs = recurrent_inputs("LSTM", lengths=np.array([4, 4, 4], np.int32))
    assert check_recurrent("LSTM", inputs, {}, constants=("w", "r", "b", "seq")).get("lstm") == 1


PARAMETRIC = [
    ("RNN", ["LeakyRelu", "HardSigmoid"], [0.3, 0.4], [0.6]),
    ("RNN", ["Relu", "Sigmoid"], [], []),
    ("GRU", ["HardSigmoid", "Tanh", "Sigmoid", "Affine"], [0.3, 0.4, 0.7], [0.6, 0.2]),
    ("GRU", ["Sigmoid", "Relu", "Tanh", "Sigmoid"], [], []),
    ("LSTM", ["HardSigmoid", "Tanh", "Softsign", "Sigmoid", "ScaledTanh", "Elu"], [0.3, 0.4, 0.7, 1.1], [0.6, 0.2]),
    ("LSTM", ["Sigmoid", "Softplus", "LeakyRelu", "Sigmoid", "ThresholdedRelu", "Tanh"], [], []),
]


@pytest.mark.parametrize("op,activations,alphas,betas", PARAMETRIC, ids=lambda v: str(v))
def test_per_direction_and_parametric_activations(op, activations, alphas, betas):
    attrs = {"direction": "bidirectional", "activations": activations}
    attrs.update({k: v for k, v in (("activation_alpha", alphas), ("activation_beta", betas)) if v})
    counts = check_recurrent(op, recurrent_inputs(op, "bidirectional", peepholes=True), attrs)
    assert op.lower() not in counts


@pytest.mark.parametrize("constants", [WEIGHTS, ()], ids=["fused", "unrolled"])
@pytest.mark.parametrize("op", ["GRU", "RNN", "LSTM"])
def test_batch_first_layout(op, constants):
    """onnxruntime lacks layout=1; the reference is the time-major model on transposed data."""
    attrs = {"hidden_size": 5, "direction": "bidirectional"}
    time_major = recurrent_inputs(op, "bidirectional")
    batch_major = {k: (v.transpose(1, 0, 2) if k in ("x", "h0", "c0") else v) for k, v in time_major.items()}
    used = [k for k in constants if k in time_major]
    feeds = {k: v for k, v in time_major.items() if v is not None and k not in used}
    reference = single_node_model(op, time_major, attrs=attrs, opset=14, outputs=OUTPUTS[op], initializers=used)
    expected = run_onnxruntime(reference, feeds)
    model = single_node_model(op, batch_major, attrs={**attrs, "layout": 1}, opset=14, outputs=OUTPUTS[op],
                              initializers=used)
    actual = lower_and_run(model, {k: v for k, v in batch_major.items() if v is not None and k not in used})
    assert_matches(actual["y0"], expected["y0"].transpose(2, 0, 1, 3), rtol=RTOL, atol=ATOL)
    for name in list(expected)[1:]:
        assert_matches(actual[name], expected[name].transpose(1, 0, 2), rtol=RTOL, atol=ATOL)


def test_unrolled_recurrent_needs_a_static_sequence_length():
    """Core ML's fused GRU takes a flexible sequence length; the exact unroll (here for clip) does not."""
    fused = single_node_model("GRU", recurrent_inputs("GRU"), attrs={"hidden_size": 5}, opset=14, outputs=2,
                              initializers=WEIGHTS)
    fused.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "T"
    lower(fused)
    unrolled = single_node_model("GRU", recurrent_inputs("GRU"), attrs={"hidden_size": 5, "clip": 2.0}, opset=14,
                                 outputs=2, initializers=WEIGHTS)
    unrolled.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "T"
    with pytest.raises(BuildError, match="static sequence length"):
        lower(unrolled)


# -- LSTM directions, peepholes and the batch-first layout ----------------------------
def _lstm_inputs(direction, *, peepholes, layout=0, steps=5, batch=2, features=3, hidden=4):
    d = 2 if direction == "bidirectional" else 1
    x_shape = (steps, batch, features) if layout == 0 else (batch, steps, features)
    state_shape = (d, batch, hidden) if layout == 0 else (batch, d, hidden)
    return {"x": rand(*x_shape), "w": rand(d, 4 * hidden, features, seed=1), "r": rand(d, 4 * hidden, hidden, seed=2),
            "b": rand(d, 8 * hidden, seed=3), "seq": None, "h0": rand(*state_shape, seed=4),
            "c0": rand(*state_shape, seed=5), "p": rand(d, 3 * hidden, seed=6) if peepholes else None}


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("peepholes", [False, True])
def test_lstm(direction, peepholes):
    inputs = _lstm_inputs(direction, peepholes=peepholes)
    check_op("LSTM", inputs, attrs={"hidden_size": 4, "direction": direction}, opset=14, outputs=3,
             initializers=("w", "r", "b", "p"), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("with_states", [True, False])
def test_lstm_batch_first_layout(with_states):
    """onnxruntime lacks layout=1; the reference is the time-major model on transposed data."""
    attrs = {"hidden_size": 4, "direction": "bidirectional"}
    time_major = _lstm_inputs("bidirectional", peepholes=False)
    if not with_states:
        time_major.update(h0=None, c0=None)
    batch_major = {**time_major, "x": time_major["x"].transpose(1, 0, 2)}
    if with_states:
        batch_major.update(h0=time_major["h0"].transpose(1, 0, 2), c0=time_major["c0"].transpose(1, 0, 2))
    weights = ("w", "r", "b")
    reference = single_node_model("LSTM", time_major, attrs=attrs, opset=14, outputs=3, initializers=weights)
    expected = run_onnxruntime(reference, {k: v for k, v in time_major.items() if v is not None and k not in weights})
    model = single_node_model("LSTM", batch_major, attrs={**attrs, "layout": 1}, opset=14, outputs=3,
                              initializers=weights)
    actual = lower_and_run(model, {k: v for k, v in batch_major.items() if v is not None and k not in weights})
    assert_matches(actual["y0"], expected["y0"].transpose(2, 0, 1, 3), rtol=RTOL, atol=ATOL)
    assert_matches(actual["y1"], expected["y1"].transpose(1, 0, 2), rtol=RTOL, atol=ATOL)
    assert_matches(actual["y2"], expected["y2"].transpose(1, 0, 2), rtol=RTOL, atol=ATOL)


# -- Loop ---------------------------------------------------------------------------------
F, I64, BOOL = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64, onnx.TensorProto.BOOL


def _info(name, elem, shape):
    return oh.make_tensor_value_info(name, elem, shape)


def _accumulate_body(stop_above: float | None = None):
    """acc += table[i] * x; scan out acc; optionally stop once sum(acc) > stop_above."""
    nodes = [
        oh.make_node("Gather", ["table", "i"], ["row"], axis=0),
        oh.make_node("Mul", ["row", "x"], ["scaled"]),
        oh.make_node("Add", ["acc_in", "scaled"], ["acc_out"]),
        oh.make_node("Identity", ["acc_out"], ["scan"]),
    ]
    if stop_above is None:
        nodes.append(oh.make_node("Identity", ["cond_in"], ["cond_out"]))
    else:
        nodes += [oh.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
                  oh.make_node("Less", ["total", "limit"], ["cond_out"])]
    inits = [onh.from_array(np.float32(stop_above or 0), "limit")] if stop_above is not None else []
    return oh.make_graph(nodes, "body", [_info("i", I64, []), _info("cond_in", BOOL, []), _info("acc_in", F, [2, 3])],
                         [_info("cond_out", BOOL, []), _info("acc_out", F, [2, 3]), _info("scan", F, [2, 3])], inits)


def _loop_model(body, *, trip=None, cond=None, runtime_trip=False, runtime_cond=False):
    inputs, inits = [_info("x", F, [2, 3]), _info("acc0", F, [2, 3])], [onh.from_array(rand(6, 2, 3, seed=7), "table")]
    loop_inputs = ["", "", "acc0"]
    if trip is not None:
        loop_inputs[0] = "m"
        (inputs.append(_info("m", I64, [])) if runtime_trip else inits.append(onh.from_array(np.int64(trip), "m")))
    if cond is not None:
        loop_inputs[1] = "c"
        (inputs.append(_info("c", BOOL, [])) if runtime_cond else inits.append(onh.from_array(np.bool_(cond), "c")))
    node = oh.make_node("Loop", loop_inputs, ["acc", "scans"], body=body)
    graph = oh.make_graph([node], "g", inputs, [onnx.ValueInfoProto(name="acc"), onnx.ValueInfoProto(name="scans")],
                          inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 16)], ir_version=IR_VERSION)


def _loop_feeds(**extra):
    return {"x": rand(2, 3, seed=1), "acc0": rand(2, 3, seed=2), **extra}


@pytest.mark.parametrize("cond", [None, True], ids=["no_cond", "cond_true"])
def test_loop_with_constant_trip_count_has_static_scan_outputs(cond):
    model = _loop_model(_accumulate_body(), trip=5, cond=cond)
    assert lower(model).op_counts.get("while_loop") == 1
    result = check(model, _loop_feeds(), rtol=RTOL, atol=ATOL)
    assert result["scans"].shape == (5, 2, 3)


@pytest.mark.parametrize("trip,cond", [(4, True), (0, True), (6, False)])
def test_loop_runtime_trip_count_and_condition(trip, cond):
    model = _loop_model(_accumulate_body(), trip=trip, cond=cond, runtime_trip=True, runtime_cond=True)
    check(model, _loop_feeds(m=np.int64(trip), c=np.bool_(cond)), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("limit", [-100.0, 0.5, 100.0])
def test_loop_stops_on_its_condition_and_cuts_scan_outputs(limit):
    model = _loop_model(_accumulate_body(stop_above=limit), trip=6, cond=True)
    check(model, _loop_feeds(), rtol=RTOL, atol=ATOL)


def test_while_loop_without_trip_count():
    body = _accumulate_body(stop_above=2.0)
    del body.output[2]  # no scan outputs
    del body.node[3]
    model = _loop_model(body, cond=True)
    del model.graph.node[0].output[1]
    del model.graph.output[1]
    model.graph.initializer[0].CopyFrom(onh.from_array(np.abs(rand(40, 2, 3, seed=7)) + 0.1, "table"))
    check(model, _loop_feeds(x=np.abs(rand(2, 3, seed=1)), acc0=np.zeros((2, 3), np.float32)), rtol=RTOL, atol=ATOL)


def test_loop_scan_outputs_without_trip_count_are_refused():
    model = _loop_model(_accumulate_body(stop_above=2.0), cond=True)
    with pytest.raises(BuildError, match="scan outputs but no trip count"):
        lower(model)


def test_loop_carried_value_changing_rank_is_refused():
    body = oh.make_graph([oh.make_node("Identity", ["cond_in"], ["cond_out"]),
                          oh.make_node("Unsqueeze", ["acc_in", "zero"], ["acc_out"])], "body",
                         [_info("i", I64, []), _info("cond_in", BOOL, []), _info("acc_in", F, None)],
                         [_info("cond_out", BOOL, []), _info("acc_out", F, None)],
                         [onh.from_array(np.array([0], np.int64), "zero")])
    graph = oh.make_graph([oh.make_node("Loop", ["m", "", "acc0"], ["acc"], body=body)], "g",
                          [_info("acc0", F, [2, 3])], [onnx.ValueInfoProto(name="acc")],
                          [onh.from_array(np.int64(2), "m")])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 16)], ir_version=IR_VERSION)
    with pytest.raises(BuildError, match="changes rank or type"):
        lower(model)


def test_loop_slicing_at_iteration_number():
    """Scan rows come from Slice(x, [i], [i + 1]); MIL cannot infer that shape, the body declares it."""
    table = np.array([1, 2, 3, 4, 5], np.float32)
    body = oh.make_graph(
        [
            oh.make_node("Identity", ["cond_in"], ["cond_out"]),
            oh.make_node("Constant", [], ["x"], value=onnx.numpy_helper.from_array(table)),
            oh.make_node("Constant", [], ["one"], value=onnx.numpy_helper.from_array(np.array(1, np.int64))),
            oh.make_node("Add", ["i", "one"], ["end"]),
            oh.make_node("Unsqueeze", ["i", "zero_axis"], ["start1"]),
            oh.make_node("Unsqueeze", ["end", "zero_axis"], ["end1"]),
            oh.make_node("Slice", ["x", "start1", "end1"], ["row"]),
            oh.make_node("Add", ["y_in", "row"], ["y_out"]),
            oh.make_node("Identity", ["y_out"], ["scan_out"]),
        ],
        "body",
        [oh.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
         oh.make_tensor_value_info("cond_in", onnx.TensorProto.BOOL, []),
         oh.make_tensor_value_info("y_in", onnx.TensorProto.FLOAT, [1])],
        [oh.make_tensor_value_info("cond_out", onnx.TensorProto.BOOL, []),
         oh.make_tensor_value_info("y_out", onnx.TensorProto.FLOAT, [1]),
         oh.make_tensor_value_info("scan_out", onnx.TensorProto.FLOAT, [1])],
        [onnx.numpy_helper.from_array(np.array([0], np.int64), "zero_axis")],
    )
    graph = oh.make_graph(
        [oh.make_node("Loop", ["m", "cond", "y"], ["y_final", "rows"], body=body)], "loop",
        [oh.make_tensor_value_info("m", onnx.TensorProto.INT64, []),
         oh.make_tensor_value_info("cond", onnx.TensorProto.BOOL, []),
         oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
        [oh.make_tensor_value_info("y_final", onnx.TensorProto.FLOAT, [1]),
         oh.make_tensor_value_info("rows", onnx.TensorProto.FLOAT, [None, 1])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)], ir_version=IR_VERSION)
    check(model, {"m": np.array(4, np.int64), "cond": np.array(True), "y": np.array([-2.0], np.float32)})


# -- If ---------------------------------------------------------------------------------
def _if_model():
    then_graph = oh.make_graph([oh.make_node("Mul", ["x", "x"], ["t"])], "then", [],
                               [oh.make_tensor_value_info("t", onnx.TensorProto.FLOAT, [2, 3])])
    else_graph = oh.make_graph([oh.make_node("Neg", ["x"], ["e"])], "else", [],
                               [oh.make_tensor_value_info("e", onnx.TensorProto.FLOAT, [2, 3])])
    nodes = [
        oh.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        oh.make_node("Greater", ["s", "zero"], ["c"]),
        oh.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=else_graph),
    ]
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])],
                          [onh.from_array(np.float32(0), "zero")])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)], ir_version=IR_VERSION)


@pytest.mark.parametrize("sign", [1, -1], ids=["then", "else"])
def test_if_runs_either_branch(sign):
    x = np.abs(rand(2, 3)) * sign + 0.01 * sign
    model = _if_model()
    assert lower(model).op_counts.get("cond") == 1
    check(model, {"x": x})


def test_if_on_a_one_element_runtime_condition():
    """A [1]-shaped runtime condition (Equal of a split shape) is reshaped to MIL's scalar predicate."""
    then_graph = oh.make_graph([oh.make_node("Add", ["x", "x"], ["t"])], "then", [],
                               [oh.make_tensor_value_info("t", onnx.TensorProto.FLOAT, [2, 3])])
    else_graph = oh.make_graph([oh.make_node("Neg", ["x"], ["e"])], "else", [],
                               [oh.make_tensor_value_info("e", onnx.TensorProto.FLOAT, [2, 3])])
    nodes = [oh.make_node("Equal", ["n", "one"], ["c"]),
             oh.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=else_graph)]
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3]),
                                       oh.make_tensor_value_info("n", onnx.TensorProto.INT64, [1])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])],
                          [onh.from_array(np.array([1], np.int64), "one")])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)], ir_version=IR_VERSION)
    for n in (1, 2):
        check(model, {"x": rand(2, 3), "n": np.array([n], np.int64)})


def test_if_branches_of_a_scalar_and_a_one_element_vector():
    """ONNX's AffineGrid body returns a scalar from one branch and a [1] tensor from the other."""
    then_graph = oh.make_graph([oh.make_node("Identity", ["zero"], ["t"])], "then", [],
                               [oh.make_tensor_value_info("t", onnx.TensorProto.FLOAT, [])])
    else_graph = oh.make_graph([oh.make_node("Div", ["two", "n_float"], ["e"])], "else", [],
                               [oh.make_tensor_value_info("e", onnx.TensorProto.FLOAT, [1])])
    nodes = [oh.make_node("Equal", ["n", "one"], ["c"]),
             oh.make_node("Cast", ["n"], ["n_float"], to=onnx.TensorProto.FLOAT),
             oh.make_node("If", ["c"], ["step"], then_branch=then_graph, else_branch=else_graph),
             oh.make_node("Mul", ["x", "step"], ["y"])]
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3]),
                                       oh.make_tensor_value_info("n", onnx.TensorProto.INT64, [1])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])],
                          [onh.from_array(np.array([1], np.int64), "one"), onh.from_array(np.float32(0), "zero"),
                           onh.from_array(np.float32(2), "two")])
    model = onnx.shape_inference.infer_shapes(
        oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)], ir_version=IR_VERSION))
    for n in (1, 4):
        check(model, {"x": rand(2, 3), "n": np.array([n], np.int64)})


# -- ONNX backend node cases --------------------------------------------------------------
NODE_CASE_MODULES = ("gru", "rnn", "lstm", "loop")
NODE_CASE_PATTERN = re.compile(r"test_(gru|rnn|simple_rnn|lstm|loop)")
NODE_CASE_XFAIL = {
    "test_loop13_seq": "sequence ops (SequenceInsert) have no lowering",
    "test_loop16_seq_none": "sequence and optional ops have no lowering",
}


def _node_cases():
    """The gru/rnn/lstm/loop cases of ``onnx.backend.test.case.node.collect_testcases()``, generated
    by importing just those case modules (their exports register the cases on import)."""
    import onnx.backend.test.case.node as node_cases

    for name in NODE_CASE_MODULES:
        importlib.import_module(f"onnx.backend.test.case.node.{name}")
    found = {c.name: c for c in node_cases._NodeTestCases if NODE_CASE_PATTERN.match(c.name)}
    return [found[name] for name in sorted(found)]


def _node_case_params():
    params = []
    for case in _node_cases():
        marks = [pytest.mark.xfail(strict=False, reason=NODE_CASE_XFAIL[case.name])] if case.name in NODE_CASE_XFAIL else []
        params.append(pytest.param(case, id=case.name, marks=marks))
    return params


@pytest.mark.parametrize("case", _node_case_params())
def test_onnx_backend_node_case(case):
    inputs, expected = case.data_sets[0]
    feeds = dict(zip([i.name for i in case.model.graph.input], inputs))
    actual = lower_and_run(case.model, feeds)
    for value, reference in zip(case.model.graph.output, expected):
        assert_matches(actual[value.name], reference, rtol=case.rtol, atol=case.atol, name=value.name)
