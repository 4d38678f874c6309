"""BitShift (LEFT and RIGHT) against onnxruntime, exactly, for every unsigned type: values over
the whole range (uint32 from 2**31 up, which Core ML holds as negative int32 patterns), every
shift amount below the width, shifts as tensors, scalars or constants, and x constant too; the
full-width results (0) for shifts past the width, with amounts that are uint32 patterns of
negative int32s; the signed types against numpy; and uint32 constants beside uint32 inputs in
the comparisons and selects a StableHLO shift is written with."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest
from edgebuild_coreml.lowering.errors import LoweringError
from onnx_cases import IR_VERSION, lower_and_run, run_onnxruntime

UNSIGNED = {np.uint8: onnx.TensorProto.UINT8, np.uint16: onnx.TensorProto.UINT16,
            np.uint32: onnx.TensorProto.UINT32, np.uint64: onnx.TensorProto.UINT64}
RNG = np.random.default_rng(11)


def _values(dtype, count):
    """Random values over the type's range (for uint64, the range Core ML's int32 can carry:
    below 2**32, as a uint32), with the edges: 0, 1, the top bit alone, all bits set."""
    bits = 32 if dtype is np.uint64 else np.iinfo(dtype).bits
    top = (1 << bits) - 1
    edges = [0, 1, 1 << (bits - 1), top, top - 1, (1 << (bits - 1)) - 1]
    drawn = RNG.integers(0, top, size=count - len(edges), dtype=np.uint64, endpoint=True)
    return np.concatenate([np.array(edges, np.uint64), drawn]).astype(dtype)


def _model(dtype, direction, x_shape, y_shape, *, constant=None, constants=None):
    """BitShift(x, y); ``constant`` names the operand ("x" or "y") given as an initializer."""
    elem = UNSIGNED[dtype]
    inputs = [oh.make_tensor_value_info(n, elem, s) for n, s in (("x", x_shape), ("y", y_shape)) if n != constant]
    initializers = [onh.from_array(constants[constant], constant)] if constant else []
    graph = oh.make_graph([oh.make_node("BitShift", ["x", "y"], ["z"], direction=direction)], "shift", inputs,
                          [oh.make_tensor_value_info("z", elem, None)], initializer=initializers)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=IR_VERSION)


def _run(model, feeds):
    """Lowered and run; the int32 results read back as the unsigned type's bit patterns."""
    return lower_and_run(model, feeds)["z"]


def _check(dtype, direction, x, y, constant=None):
    arrays = {"x": x, "y": y}
    model = _model(dtype, direction, list(x.shape), list(y.shape), constant=constant, constants=arrays)
    feeds = {k: v for k, v in arrays.items() if k != constant}
    want = run_onnxruntime(model, feeds)["z"]
    got = _run(model, feeds)
    assert got.shape == want.shape
    bits = 32 if dtype is np.uint64 else np.iinfo(dtype).bits
    mask = np.uint64((1 << bits) - 1)
    got_bits = got.astype(np.int64).astype(np.uint64) & mask  # an int32 pattern as the type's bits
    np.testing.assert_array_equal(got_bits, want.astype(np.uint64) & mask, err_msg=f"{direction} {x} by {y}")


def _amounts(dtype):
    return np.arange(32 if dtype is np.uint64 else np.iinfo(dtype).bits)


DTYPES = list(UNSIGNED)
IDS = [np.dtype(d).name for d in DTYPES]


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_every_amount_below_the_width_on_values_over_the_range(dtype, direction):
    amounts = _amounts(dtype).astype(dtype)
    x = _values(dtype, 12)
    # every value shifted by every amount: x down the rows, amounts across
    _check(dtype, direction, np.repeat(x[:, None], len(amounts), axis=1), np.tile(amounts, (len(x), 1)))


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_broadcast_amounts(dtype, direction):
    x = _values(dtype, 16).reshape(4, 4)
    bits = len(_amounts(dtype))
    _check(dtype, direction, x, np.array([0, 1, bits // 2, bits - 1], dtype))  # one amount per column
    _check(dtype, direction, x, np.array(bits - 3, dtype).reshape(()))  # one amount for all


@pytest.mark.parametrize("constant", ["x", "y"])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_constant_operands(dtype, direction, constant):
    bits = len(_amounts(dtype))
    x = _values(dtype, 8)
    y = np.array([0, 1, 2, 3, bits // 2, bits - 3, bits - 2, bits - 1], dtype)
    _check(dtype, direction, x, y, constant=constant)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32], ids=["uint8", "uint16", "uint32"])
def test_shifts_past_the_width_give_zero(dtype, direction):
    # onnxruntime shifts in C++, where a shift past 31 bits is undefined: this is the lowering's
    # own definition (the full-width result), with uint32 amounts from 2**31 up (negative as int32)
    bits = np.iinfo(dtype).bits
    amounts = [bits, bits + 1, 40, 255] + ([1 << 31, (1 << 32) - 1, (1 << 32) - 2] if dtype is np.uint32 else [])
    amounts = np.array([a for a in amounts if a <= np.iinfo(dtype).max], dtype)
    x = np.resize(_values(dtype, 8), amounts.shape)
    got = _run(_model(dtype, direction, list(x.shape), list(amounts.shape)), {"x": x, "y": amounts})
    np.testing.assert_array_equal(got, np.zeros_like(got))


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_uint32_against_numpy_on_many_values(direction):
    # numpy's uint32 shifts are exact for amounts below 32: a wide sweep beyond onnxruntime's cases
    x = _values(np.uint32, 2000)
    y = RNG.integers(0, 32, size=x.shape).astype(np.uint32)
    got = _run(_model(np.uint32, direction, list(x.shape), list(y.shape)), {"x": x, "y": y})
    want = np.left_shift(x, y) if direction == "LEFT" else np.right_shift(x, y)
    np.testing.assert_array_equal(got.astype(np.uint32), want)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype, elem", [(np.int8, onnx.TensorProto.INT8), (np.int16, onnx.TensorProto.INT16),
                                         (np.int32, onnx.TensorProto.INT32)], ids=["int8", "int16", "int32"])
def test_signed_types_shift_as_numpy(dtype, elem, direction):
    # ONNX types BitShift unsigned only, so onnxruntime has no kernel: numpy's two's-complement
    # shifts are the reference (LEFT wraps into the width, RIGHT copies the sign in)
    info = np.iinfo(dtype)
    x = np.concatenate([[info.min, info.max, -1, 0, 1], RNG.integers(info.min, info.max, 19, endpoint=True)])
    x = np.repeat(x.astype(dtype)[:, None], info.bits, axis=1)
    y = np.tile(np.arange(info.bits, dtype=dtype), (x.shape[0], 1))
    graph = oh.make_graph([oh.make_node("BitShift", ["x", "y"], ["z"], direction=direction)], "shift",
                          [oh.make_tensor_value_info(n, elem, list(x.shape)) for n in ("x", "y")],
                          [oh.make_tensor_value_info("z", elem, None)])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=IR_VERSION)
    got = _run(model, {"x": x, "y": y})
    want = np.left_shift(x, y) if direction == "LEFT" else np.right_shift(x, y)
    np.testing.assert_array_equal(got.astype(np.int64), want.astype(np.int64))


@pytest.mark.parametrize("kind", ["shift_left", "shift_right_logical"])
def test_the_stablehlo_shift_form_with_uint32_constants(kind):
    # lax.shift_left on uint32 converts to: amounts of 32 or more give 0 (GreaterOrEqual against a
    # uint32 constant, Where with a uint32 zero), else BitShift
    U = onnx.TensorProto.UINT32
    nodes = [oh.make_node("Constant", [], ["width"], value=onh.from_array(np.array(32, np.uint32), "width")),
             oh.make_node("Constant", [], ["zero"], value=onh.from_array(np.array(0, np.uint32), "zero")),
             oh.make_node("GreaterOrEqual", ["y", "width"], ["too_far"]),
             oh.make_node("Where", ["too_far", "zero", "y"], ["amount"]),
             oh.make_node("BitShift", ["x", "amount"], ["shifted"],
                          direction="LEFT" if kind == "shift_left" else "RIGHT"),
             oh.make_node("Where", ["too_far", "zero", "shifted"], ["z"])]
    graph = oh.make_graph(nodes, "shift", [oh.make_tensor_value_info(n, U, [64]) for n in ("x", "y")],
                          [oh.make_tensor_value_info("z", U, None)])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=IR_VERSION)
    x = _values(np.uint32, 64)
    y = np.concatenate([np.arange(32), [32, 33, 100, 1 << 20] * 8]).astype(np.uint32)
    got = _run(model, {"x": x, "y": y})
    big = y >= 32
    shifted = np.left_shift(x, np.where(big, 0, y)) if kind == "shift_left" else np.right_shift(x, np.where(big, 0, y))
    np.testing.assert_array_equal(got.astype(np.uint32), np.where(big, np.uint32(0), shifted))


def test_a_uint32_constant_past_int32_is_refused_by_name():
    U = onnx.TensorProto.UINT32
    graph = oh.make_graph([oh.make_node("Add", ["x", "big"], ["z"])], "add", [oh.make_tensor_value_info("x", U, [2])],
                          [oh.make_tensor_value_info("z", U, None)],
                          initializer=[onh.from_array(np.array([1, 1 << 31], np.uint32), "big")])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=IR_VERSION)
    with pytest.raises(LoweringError, match=r"'big'.*outside int32"):
        _run(model, {"x": np.array([1, 2], np.uint32)})
