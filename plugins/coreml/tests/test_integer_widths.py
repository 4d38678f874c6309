"""Elementwise and comparison ops over every integer width, exactly against onnxruntime.

Core ML computes every integer in int32, so each op is checked over int8/uint8/int16/uint16 (whose
results wrap into the type), int32, uint32 (held as bit patterns: values from 2**31 up are negative
int32s, and order and divide unsigned) and the 64-bit types (carried as int32), with each operand a tensor or
an initializer (a tensor, and a scalar that broadcasts). Where onnxruntime has no kernel for a type,
ONNX's reference evaluator is the reference."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest
from onnx.reference import ReferenceEvaluator
from onnx_cases import IR_VERSION, lower_and_run, run_onnxruntime

DTYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]
IDS = [np.dtype(d).name for d in DTYPES]
ARITHMETIC = ["Add", "Sub", "Mul", "Div", "Mod", "ModFmod", "Max", "Min"]
COMPARISONS = ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"]
BITWISE = ["BitwiseAnd", "BitwiseOr", "BitwiseXor"]
SIZE = 24
# Each operand form: which of a and b are initializers, and whether the constant one is a scalar.
FORMS = {"inputs": (), "constant_b": ("b",), "constant_a": ("a",), "scalar_b": ("b", "scalar")}


def _range(dtype, op: str) -> tuple[int, int]:
    """The values drawn: the type's range; 64-bit types within what int32 carries (products and
    sums within int16 magnitudes, so they stay exact)."""
    info = np.iinfo(dtype)
    if info.bits < 64:
        return int(info.min), int(info.max)
    if op in ("Add", "Sub", "Mul"):
        return (-(1 << 15) if info.kind == "i" else 0), (1 << 15)
    return (-(1 << 31), (1 << 31) - 1) if info.kind == "i" else (0, (1 << 32) - 1)


def _values(dtype, op: str, seed: int) -> np.ndarray:
    """The range's edges (its ends, 0, 1, -1, the 2**31 boundary of uint32 patterns) and random draws."""
    low, high = _range(dtype, op)
    edges = [e for e in (low, high, 0, 1, -1, low + 1, high - 1, 1 << 31, (1 << 31) - 1) if low <= e <= high]
    drawn = np.random.default_rng(seed).integers(low, high, SIZE - len(edges), endpoint=True, dtype=np.int64)
    return np.concatenate([np.array(edges, np.int64), drawn]).astype(dtype)


def _pair(dtype, op: str):
    a, b = _values(dtype, op, 1), _values(dtype, op, 2)[::-1].copy()
    a[:4] = b[:4]  # some equal pairs, for the comparisons
    if op in ("Div", "Mod", "ModFmod"):
        b[b == 0] = 3
        if np.iinfo(dtype).bits >= 32:  # INT_MIN / -1 traps in onnxruntime's C++ kernels: no answer to match
            b[(a == np.iinfo(dtype).min) & (b == -1)] = 7
    return a, b


def _node(op: str, inputs, output: str):
    if op == "ModFmod":
        return oh.make_node("Mod", inputs, [output], fmod=1)
    return oh.make_node(op, inputs, [output])


def _model(op: str, dtype, arrays, constants, *, unary=False):
    elem = oh.np_dtype_to_tensor_dtype(np.dtype(dtype))
    names = ["a"] if unary else ["a", "b"]
    inputs = [oh.make_tensor_value_info(n, elem, list(arrays[n].shape)) for n in names if n not in constants]
    initializers = [onh.from_array(arrays[n], n) for n in names if n in constants]
    graph = oh.make_graph([_node(op, names, "z")], "widths", inputs, [onnx.ValueInfoProto(name="z")],
                          initializer=initializers)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=IR_VERSION)
    return onnx.shape_inference.infer_shapes(model)


def _reference(model, feeds):
    try:
        return run_onnxruntime(model, feeds)["z"]
    except Exception as exc:  # noqa: BLE001 - onnxruntime registers no kernel for some types (Max on int16)
        if "NOT_IMPLEMENTED" not in str(exc):
            raise
        return ReferenceEvaluator(model).run(None, feeds)[0]


def _as_held(array: np.ndarray, dtype) -> np.ndarray:
    """Values as Core ML holds them: 32- and 64-bit types as the low 32 bits' int32 pattern."""
    array = np.asarray(array)
    if array.dtype == np.bool_ or np.iinfo(dtype).bits < 32:
        return array.astype(np.int64)
    return array.astype(np.int64).astype(np.uint64).astype(np.uint32).view(np.int32).astype(np.int64)


def _check(op, dtype, arrays, form, *, unary=False):
    constants = FORMS[form]
    if "scalar" in constants:
        arrays = {**arrays, "b": np.asarray(arrays["b"][5])}
    if op in ("Add", "Sub", "Mul") and np.iinfo(dtype).kind == "u" and np.iinfo(dtype).bits >= 32:
        # arithmetic refuses uint32 constants from 2**31 up by name (test_bit_shift_unsigned): kept below
        arrays = {n: v % (1 << 31) if n in constants else v for n, v in arrays.items()}
    model = _model(op, dtype, arrays, constants, unary=unary)
    feeds = {n: v for n, v in arrays.items() if n not in constants and (n == "a" or not unary)}
    want = _reference(model, feeds)
    got = lower_and_run(model, feeds)["z"]
    assert got.shape == want.shape
    if want.dtype == np.bool_:
        assert got.dtype == np.bool_
    np.testing.assert_array_equal(_as_held(got, dtype), _as_held(want, dtype), err_msg=f"{op} {form} {arrays}")


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("op", ARITHMETIC + COMPARISONS + BITWISE)
def test_binary_ops_over_every_width(op, dtype, form):
    a, b = _pair(dtype, op)
    _check(op, dtype, {"a": a, "b": b}, form)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("op", ["BitwiseNot", "Abs", "Neg"])
def test_unary_ops_over_every_width(op, dtype):
    if op == "Neg" and np.iinfo(dtype).kind == "u":
        pytest.skip("ONNX types Neg signed only")
    a = _values(dtype, op, 3)
    _check(op, dtype, {"a": a}, "inputs", unary=True)
    _check(op, dtype, {"a": a}, "constant_a", unary=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_where_selects_constants_of_every_width(dtype):
    # a branch constant beside a tensor branch: uint32 constants from 2**31 up are selected as patterns
    elem = oh.np_dtype_to_tensor_dtype(np.dtype(dtype))
    a, b = _pair(dtype, "Max")
    nodes = [oh.make_node("Less", ["a", "b"], ["smaller"]), oh.make_node("Where", ["smaller", "b", "a"], ["z"])]
    graph = oh.make_graph(nodes, "where", [oh.make_tensor_value_info("a", elem, [SIZE])],
                          [onnx.ValueInfoProto(name="z")], initializer=[onh.from_array(b, "b")])
    model = onnx.shape_inference.infer_shapes(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)],
                                                            ir_version=IR_VERSION))
    got = lower_and_run(model, {"a": a})["z"]
    want = _reference(model, {"a": a})
    np.testing.assert_array_equal(_as_held(got, dtype), _as_held(want, dtype))


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16], ids=["int8", "uint8", "int16", "uint16"])
def test_narrow_arithmetic_wraps_every_pair(op, dtype):
    # every pair of edge values (ends, zero, one), so each wrap direction is met: 255 + 1, 0 - 1, 128 * 2
    info = np.iinfo(dtype)
    edges = np.array(sorted({int(info.min), int(info.min) + 1, -1 if info.kind == "i" else 2, 0, 1,
                             int(info.max) - 1, int(info.max), int(info.max) // 2 + 1}), dtype)
    a, b = np.repeat(edges, len(edges)), np.tile(edges, len(edges))
    _check(op, dtype, {"a": a, "b": b}, "inputs")


@pytest.mark.parametrize("op", ["Div", "Mod"])
def test_uint32_division_over_the_whole_range(op):
    # every edge dividend by every edge divisor (1, 2, the 2**30 and 2**31 boundaries, the top), and a
    # wide random sweep, against numpy's unsigned division
    edges = np.array([0, 1, 2, 3, (1 << 30) - 1, 1 << 30, (1 << 31) - 1, 1 << 31, (1 << 31) + 1,
                      (1 << 32) - 2, (1 << 32) - 1], np.uint32)
    rng = np.random.default_rng(5)
    a = np.concatenate([np.repeat(edges, len(edges)), rng.integers(0, 1 << 32, 2000, dtype=np.uint64)])
    b = np.concatenate([np.tile(edges, len(edges)), rng.integers(1, 1 << 32, 1000, dtype=np.uint64),
                        rng.integers(1, 1 << 12, 1000, dtype=np.uint64)])
    a, b = a.astype(np.uint32), np.where(b == 0, 7, b).astype(np.uint32)
    model = _model(op, np.uint32, {"a": a, "b": b}, ())
    got = lower_and_run(model, {"a": a, "b": b})["z"]
    want = a // b if op == "Div" else a % b
    np.testing.assert_array_equal(got.astype(np.uint32), want)
