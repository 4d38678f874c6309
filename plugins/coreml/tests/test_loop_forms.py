"""Loop forms against onnxruntime: carried values that start as constants or as graph inputs,
scalars and tensors of every dtype Core ML holds, ended by a trip count (constant or an input),
by a condition the body computes (from a counter or from the values themselves), or both; and
counters that start from rank-0 graph inputs, as a ``fori_loop`` with traced bounds gives."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest
from onnx_cases import IR_VERSION, check

T = onnx.TensorProto
ONNX_TYPE = {np.float32: T.FLOAT, np.float16: T.FLOAT16, np.int32: T.INT32, np.int64: T.INT64, np.bool_: T.BOOL}
DTYPES = [np.float32, np.float16, np.int32, np.int64, np.bool_]
SHAPES = [(), (2, 3)]


def _vi(name, elem, shape):
    return oh.make_tensor_value_info(name, elem, shape)


def _const(name, value):
    return oh.make_node("Constant", [], [name], value=onh.from_array(np.asarray(value), name))


def _model(nodes, inputs, outputs, initializers=()):
    graph = oh.make_graph(nodes, "loop_forms", inputs, outputs, initializer=list(initializers))
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    return model


def _start(dtype, shape):
    if dtype is np.bool_:
        return np.resize(np.array([True, False]), shape).reshape(shape)
    return (np.arange(int(np.prod(shape))).reshape(shape) % 3 + 1).astype(dtype)


def _step_nodes(dtype):
    """v -> v * 1.5 + 1 (floats), v + 3 (integers), not v (bool): a value that changes every iteration."""
    if dtype is np.bool_:
        return [oh.make_node("Not", ["v"], ["v_next"])]
    if np.issubdtype(dtype, np.floating):
        return [_const("scale", np.array(1.5, dtype)), _const("bias", np.array(1.0, dtype)),
                oh.make_node("Mul", ["v", "scale"], ["scaled"]), oh.make_node("Add", ["scaled", "bias"], ["v_next"])]
    return [_const("three", np.array(3, dtype)), oh.make_node("Add", ["v", "three"], ["v_next"])]


def _value_stop_nodes(dtype, limit):
    """keep going while max(v_next) < limit (the condition computed from the carried value itself)."""
    cast = [] if dtype is np.float32 else [oh.make_node("Cast", ["v_next"], ["v_f32"], to=T.FLOAT)]
    source = "v_next" if dtype is np.float32 else "v_f32"
    return cast + [oh.make_node("ReduceMax", [source], ["top"], keepdims=0),
                   _const("limit", np.float32(limit)),
                   oh.make_node("Less", ["top", "limit"], ["cond_out"])]


def loop_model(dtype, shape, *, init, trip, stop, counter_init="const", limit=4):
    """One Loop carrying ``v`` (``dtype``, ``shape``) and an int32 counter ``c``.

    init / counter_init: where v / c start ("const": an initializer, "input": a graph input);
    trip: None, "const" or "input" (the trip count M); stop: "none" (the body gives its condition
    back), "counter" (c + 1 < limit), "value" (max(v) < limit).
    """
    elem = ONNX_TYPE[dtype]
    inputs, initializers = [], []

    def source(name, value, how, onnx_type):
        if how == "input":
            inputs.append(oh.make_tensor_value_info(name, onnx_type, list(np.shape(value))))
        else:
            initializers.append(onh.from_array(np.asarray(value), name))
        return name

    feeds = {"v0": _start(dtype, shape), "c0": np.array(0, np.int32), "m": np.array(6, np.int64)}
    v0 = source("v0", feeds["v0"], init, elem)
    c0 = source("c0", feeds["c0"], counter_init, T.INT32)
    m = "" if trip is None else source("m", feeds["m"], trip, T.INT64)

    body_nodes = _step_nodes(dtype) + [
        _const("one", np.int32(1)),
        oh.make_node("Add", ["c", "one"], ["c_next"]),
    ]
    if stop == "counter":
        body_nodes += [_const("c_limit", np.int32(limit)), oh.make_node("Less", ["c_next", "c_limit"], ["cond_out"])]
    elif stop == "value":
        body_nodes += _value_stop_nodes(dtype, limit)
    else:
        body_nodes.append(oh.make_node("Identity", ["cond_in"], ["cond_out"]))
    body = oh.make_graph(
        body_nodes, "body",
        [oh.make_tensor_value_info("i", T.INT64, []), oh.make_tensor_value_info("cond_in", T.BOOL, []),
         oh.make_tensor_value_info("v", elem, list(shape)), oh.make_tensor_value_info("c", T.INT32, [])],
        [oh.make_tensor_value_info("cond_out", T.BOOL, []), oh.make_tensor_value_info("v_next", elem, list(shape)),
         oh.make_tensor_value_info("c_next", T.INT32, [])])
    # the first condition: a constant true, or the body's test on the initial values (as the
    # StableHLO frontend writes a while loop), computed before the loop
    if stop == "counter":
        outer = [_const("first_limit", np.int32(limit)), oh.make_node("Less", [c0, "first_limit"], ["cond0"])]
    else:
        outer = [_const("cond0", np.bool_(True))]
    outer.append(oh.make_node("Loop", [m, "cond0", v0, c0], ["v_final", "c_final"], body=body))
    graph = oh.make_graph(outer, "loop_forms", inputs,
                          [oh.make_tensor_value_info("v_final", elem, list(shape)),
                           oh.make_tensor_value_info("c_final", T.INT32, [])], initializer=initializers)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    return model, {i.name: feeds[i.name] for i in inputs}


def _tolerance(dtype):
    return {"rtol": 2e-3, "atol": 2e-3} if dtype is np.float16 else {"rtol": 1e-5, "atol": 1e-5}


# (trip, stop): a trip count alone, a condition alone, both
ENDINGS = [("const", "none"), ("input", "none"), (None, "counter"), ("const", "counter"), ("input", "counter")]


@pytest.mark.parametrize("trip, stop", ENDINGS)
@pytest.mark.parametrize("init", ["const", "input"])
@pytest.mark.parametrize("shape", SHAPES, ids=["scalar", "tensor"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_carried_values_of_every_dtype_and_source(dtype, shape, init, trip, stop):
    model, feeds = loop_model(dtype, shape, init=init, trip=trip, stop=stop)
    check(model, feeds, **_tolerance(dtype))


@pytest.mark.parametrize("trip", [None, "const"])
@pytest.mark.parametrize("init", ["const", "input"])
@pytest.mark.parametrize("shape", SHAPES, ids=["scalar", "tensor"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32], ids=lambda d: np.dtype(d).name)
def test_condition_computed_from_the_carried_value(dtype, shape, init, trip):
    # while max(v) < 40: v grows each iteration, so the loop stops on the value, not on a count
    model, feeds = loop_model(dtype, shape, init=init, trip=trip, stop="value", limit=40)
    check(model, feeds, **_tolerance(dtype))


@pytest.mark.parametrize("start", [-2, 0, 3, 4, 7])
@pytest.mark.parametrize("trip, stop", [(None, "counter"), ("input", "counter"), ("const", "none"), ("input", "none")])
def test_counter_starting_from_a_rank0_input(start, trip, stop):
    # fori_loop(start, 4): the counter is loop-carried from a rank-0 graph input (a MIL scalar,
    # where the body's Add gives a rank-0 tensor); "counter": 4 - start iterations when positive,
    # at most M = 6; "none": M iterations
    model, feeds = loop_model(np.float32, (2, 3), init="input", trip=trip, stop=stop, counter_init="input")
    feeds["c0"] = np.array(start, np.int32)
    got = check(model, feeds)
    if stop == "none":
        assert int(got["c_final"]) == start + 6
    else:
        assert int(got["c_final"]) == max(start, 4 if trip is None else min(4, start + 6))


def test_everything_constant_ends_on_its_condition():
    # jax.lax.while_loop(lambda c: c[0] < 10, lambda c: (c[0] * 1.5 + 1, c[1] + 1), (1.0, 0)):
    # no input reaches the loop, and its first condition is true at build time
    model, feeds = loop_model(np.float32, (), init="const", trip=None, stop="value", counter_init="const", limit=10)
    assert feeds == {}
    got = check(model, {})
    assert float(got["v_final"]) >= 10 and int(got["c_final"]) == 4  # 1 -> 2.5 -> 4.75 -> 8.125 -> 13.19



@pytest.mark.parametrize("init", ["const", "input"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_], ids=lambda d: np.dtype(d).name)
def test_body_resets_a_carried_value_to_a_constant(dtype, init):
    # flag starts at one value and the body sets it to another every iteration: its value changes
    # once, then stays, and the loop (ended by a counter condition) must still carry it
    elem = ONNX_TYPE[dtype]
    start, reset = (np.array([True, False]), np.array([False, True])) if dtype is np.bool_ else \
        (np.array([1, 2], dtype), np.array([7, 9], dtype))
    body = oh.make_graph(
        [_const("reset", reset.astype(dtype)), oh.make_node("Identity", ["reset"], ["flag_next"]),
         _const("one", np.int32(1)), oh.make_node("Add", ["c", "one"], ["c_next"]),
         _const("limit", np.int32(3)), oh.make_node("Less", ["c_next", "limit"], ["cond_out"])],
        "body", [_vi("i", T.INT64, []), _vi("cond_in", T.BOOL, []), _vi("flag", elem, [2]), _vi("c", T.INT32, [])],
        [_vi("cond_out", T.BOOL, []), _vi("flag_next", elem, [2]), _vi("c_next", T.INT32, [])])
    inputs = [_vi("flag0", elem, [2])] if init == "input" else []
    initializers = [] if init == "input" else [onh.from_array(start.astype(dtype), "flag0")]
    model = _model([_const("c0", np.int32(0)), _const("cond0", np.bool_(True)),
                    oh.make_node("Loop", ["", "cond0", "flag0", "c0"], ["flag", "count"], body=body)],
                   inputs, [_vi("flag", elem, [2]), _vi("count", T.INT32, [])], initializers)
    got = check(model, {"flag0": start.astype(dtype)} if init == "input" else {})
    np.testing.assert_array_equal(got["flag"].astype(dtype), reset.astype(dtype))


@pytest.mark.parametrize("trip", [None, "const"])
def test_a_carried_shape_that_keeps_its_value_stays_a_constant(trip):
    # the body carries Shape(x) and reshapes with it; the shape never changes, so MIL may keep it
    # a constant: the scan rows (with a trip count) gather into a buffer preallocated as [M, 2, 3]
    scans = trip is not None
    nodes = [oh.make_node("Reshape", ["x", "shape"], ["flat"]), _const("half", np.float32(0.5)),
             oh.make_node("Mul", ["flat", "half"], ["x_next"]), oh.make_node("Shape", ["x_next"], ["shape_next"]),
             _const("limit", np.float32(0.2)), oh.make_node("ReduceMax", ["x_next"], ["top"], keepdims=0),
             oh.make_node("Greater", ["top", "limit"], ["cond_out"])]
    outputs = [_vi("cond_out", T.BOOL, []), _vi("x_next", T.FLOAT, [2, 3]), _vi("shape_next", T.INT64, [2])]
    if scans:
        nodes.append(oh.make_node("Identity", ["x_next"], ["row"]))
        outputs.append(_vi("row", T.FLOAT, [2, 3]))
    body = oh.make_graph(nodes, "body", [_vi("i", T.INT64, []), _vi("cond_in", T.BOOL, []),
                                         _vi("x", T.FLOAT, [2, 3]), _vi("shape", T.INT64, [2])], outputs)
    results = [_vi("x", T.FLOAT, [2, 3]), _vi("shape", T.INT64, [2])] + ([_vi("rows", T.FLOAT, ["n", 2, 3])] * scans)
    loop = oh.make_node("Loop", ["m" if scans else "", "cond0", "x0", "shape0"], [r.name for r in results], body=body)
    model = _model([_const("cond0", np.bool_(True)), _const("shape0", np.array([2, 3], np.int64)),
                    _const("m", np.int64(8)), loop], [_vi("x0", T.FLOAT, [2, 3])], results)
    got = check(model, {"x0": np.linspace(0.5, 3.0, 6, dtype=np.float32).reshape(2, 3)})
    if scans:
        assert got["rows"].shape == (4, 2, 3)  # 3.0 halves to 0.1875 on the 4th iteration


@pytest.mark.parametrize("start", ["const", "input"])
def test_scan_rows_with_constant_carries_and_a_condition(start):
    # cumulative rows from a carried counter that starts as a constant; the condition stops the
    # loop before its trip count, so only the rows written come out
    body = oh.make_graph(
        [_const("one", np.int32(1)), oh.make_node("Add", ["c", "one"], ["c_next"]),
         oh.make_node("Cast", ["c_next"], ["c_float"], to=T.FLOAT),
         oh.make_node("Add", ["acc", "c_float"], ["acc_next"]),
         oh.make_node("Identity", ["acc_next"], ["row"]),
         _const("limit", np.int32(5)), oh.make_node("Less", ["c_next", "limit"], ["cond_out"])],
        "body", [_vi("i", T.INT64, []), _vi("cond_in", T.BOOL, []), _vi("c", T.INT32, []), _vi("acc", T.FLOAT, [3])],
        [_vi("cond_out", T.BOOL, []), _vi("c_next", T.INT32, []), _vi("acc_next", T.FLOAT, [3]),
         _vi("row", T.FLOAT, [3])])
    acc0 = np.array([0.0, 1.0, -1.0], np.float32)
    inputs = [_vi("acc0", T.FLOAT, [3])] if start == "input" else []
    initializers = [] if start == "input" else [onh.from_array(acc0, "acc0")]
    model = _model([_const("c0", np.int32(0)), _const("cond0", np.bool_(True)), _const("m", np.int64(10)),
                    oh.make_node("Loop", ["m", "cond0", "c0", "acc0"], ["c", "acc", "rows"], body=body)],
                   inputs, [_vi("c", T.INT32, []), _vi("acc", T.FLOAT, [3]), _vi("rows", T.FLOAT, ["n", 3])],
                   initializers)
    got = check(model, {"acc0": acc0} if start == "input" else {})
    assert got["rows"].shape == (5, 3)
