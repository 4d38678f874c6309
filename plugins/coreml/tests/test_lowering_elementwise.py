"""Elementwise op lowerings against onnxruntime: binary and variadic math, unary math, comparison
and logic, casts (lowering/ops/unary.py, binary.py, logic.py, cast.py). One-node models, lowered
and run in edgebuild's MIL interpreter."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_cases import I64, X, lower, op_table_test, single_node_model

from edgebuild_coreml.lowering.errors import LoweringError

POS = (np.abs(X) + 0.1).astype(np.float32)
UNIT = np.clip(X / 3, -0.95, 0.95).astype(np.float32)

# (op, inputs, attrs, initializer names, opset, outputs)
CASES = {
    # binary / variadic math
    "add_broadcast": ("Add", {"a": X, "b": X[0, 0]}, {}, (), 18, 1),
    "sub": ("Sub", {"a": X, "b": X[::-1]}, {}, (), 18, 1),
    "mul_int": ("Mul", {"a": I64(3, -4, 5), "b": I64(2, 2, -2)}, {}, (), 18, 1),
    "div_float": ("Div", {"a": X, "b": POS}, {}, (), 18, 1),
    "div_int_truncates": ("Div", {"a": I64(7, -7, 7, -7, 0, 6), "b": I64(2, 2, -2, -2, 3, -3)}, {}, (), 18, 1),
    "pow": ("Pow", {"a": POS, "b": X}, {}, (), 18, 1),
    "pow_int_exponent": ("Pow", {"a": X, "b": I64(2)}, {}, ("b",), 18, 1),
    "mod_int": ("Mod", {"a": I64(7, -7, 7, -7, 4), "b": I64(3, 3, -3, -3, 2)}, {}, (), 18, 1),
    "mod_fmod_int": ("Mod", {"a": I64(7, -7, 7, -7), "b": I64(3, 3, -3, -3)}, {"fmod": 1}, (), 18, 1),
    "mod_fmod_float": ("Mod", {"a": X * 5, "b": POS + 1}, {"fmod": 1}, (), 18, 1),
    "max3": ("Max", {"a": X, "b": X[0], "c": -X}, {}, (), 18, 1),
    "min1": ("Min", {"a": X}, {}, (), 18, 1),
    "sum": ("Sum", {"a": X, "b": X}, {}, (), 18, 1),
    "mean": ("Mean", {"a": X, "b": X[0], "c": X[0, 0]}, {}, (), 18, 1),
    # unary math
    **{
        f"unary_{op.lower()}": (op, {"x": data}, {}, (), 18, 1)
        for op, data in [
            ("Abs", X), ("Neg", X), ("Reciprocal", POS), ("Sqrt", POS), ("Exp", X), ("Log", POS),
            ("Ceil", X), ("Floor", X), ("Sign", X), ("Sin", X), ("Cos", X), ("Tan", UNIT),
            ("Asin", UNIT), ("Acos", UNIT), ("Atan", X), ("Sinh", X), ("Cosh", X), ("Asinh", X),
            ("Acosh", POS + 1), ("Atanh", UNIT), ("Erf", X),
        ]
    },
    "round_half_even": ("Round", {"x": np.array([0.5, 1.5, 2.5, -0.5, -1.5, 0.4], np.float32)}, {}, (), 18, 1),
    "abs_int": ("Abs", {"x": I64(-3, 0, 4)}, {}, (), 18, 1),
    "neg_int": ("Neg", {"x": I64(-3, 0, 4)}, {}, (), 18, 1),
    "isnan": ("IsNaN", {"x": np.array([np.nan, 1, np.inf], np.float32)}, {}, (), 18, 1),
    "isinf": ("IsInf", {"x": np.array([np.nan, 1, np.inf, -np.inf], np.float32)}, {}, (), 18, 1),
    "isinf_neg_only": ("IsInf", {"x": np.array([1, np.inf, -np.inf], np.float32)}, {"detect_positive": 0}, (), 18, 1),
    "not": ("Not", {"x": X > 0}, {}, (), 18, 1),
    # comparison / logic
    **{
        f"compare_{op.lower()}": (op, {"a": X, "b": np.round(X)}, {}, (), 18, 1)
        for op in ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual")
    },
    "equal_int": ("Equal", {"a": I64(1, 2, 3), "b": I64(1, 0, 3)}, {}, (), 18, 1),
    "equal_bool": ("Equal", {"a": X > 0, "b": X > 0.5}, {}, (), 18, 1),
    **{f"logic_{op.lower()}": (op, {"a": X > 0, "b": X > 0.5}, {}, (), 18, 1) for op in ("And", "Or", "Xor")},
    "where": ("Where", {"c": X > 0, "a": X, "b": X[0, 0]}, {}, (), 18, 1),
    # casts
    "cast_float_to_int": ("Cast", {"x": X * 3}, {"to": 7}, (), 18, 1),
    "cast_int_to_float": ("Cast", {"x": I64(1, -2, 3)}, {"to": 1}, (), 18, 1),
    "cast_to_bool": ("Cast", {"x": np.round(X)}, {"to": 9}, (), 18, 1),
    "cast_const": ("Cast", {"x": I64(1, 2, 3)}, {"to": 1}, ("x",), 18, 1),
    "castlike": ("CastLike", {"x": X * 3, "like": I64(0)}, {}, (), 18, 1),
    # integer types carried as int32 wrap into their own width, as ONNX's fixed-point casts do
    "cast_int32_to_int8_wraps": ("Cast", {"x": np.array([200, -200, 127, 128, -129, 5], np.int32)}, {"to": 3},
                                 (), 18, 1),
    "cast_int64_to_uint8_wraps": ("Cast", {"x": I64(300, -1, 255, 256, 0)}, {"to": 2}, (), 18, 1),
    "cast_int32_to_uint16_wraps": ("Cast", {"x": np.array([70000, -1, 65535], np.int32)}, {"to": 4}, (), 18, 1),
    "cast_float_to_int16": ("Cast", {"x": X * 300}, {"to": 5}, (), 18, 1),
    "cast_const_wraps": ("Cast", {"x": np.array([200, -200], np.int32)}, {"to": 3}, ("x",), 18, 1),
    "cast_uint8_to_int16_unchanged": ("Cast", {"x": np.array([0, 200, 255], np.uint8)}, {"to": 5}, (), 18, 1),
    # unsigned inputs whose values fit int32
    "add_uint16": ("Add", {"a": np.array([1, 60000, 7], np.uint16), "b": np.array([2, 5000, 9], np.uint16)}, {},
                   (), 18, 1),
    "less_uint32": ("Less", {"a": np.array([1, 2_000_000_000, 7], np.uint32), "b": np.array([2, 5, 7], np.uint32)},
                    {}, (), 18, 1),
    "max_uint64": ("Max", {"a": np.array([1, 2_000_000_000], np.uint64), "b": np.array([2, 5], np.uint64)}, {},
                   (), 18, 1),
    "identity": ("Identity", {"x": X}, {}, (), 18, 1),
    "dropout": ("Dropout", {"x": X}, {}, (), 18, 1),
    "dropout_mask": ("Dropout", {"x": X}, {}, (), 18, 2),
}


test_matches_onnxruntime = op_table_test(CASES)


def test_mod_fmod0_on_floats_is_refused():
    model = single_node_model("Mod", {"a": X, "b": POS})
    with pytest.raises(LoweringError, match="fmod=1"):
        lower(model)


@pytest.mark.parametrize("to", ["INT4", "UINT4", "INT2", "UINT2"])
def test_cast_to_sub_byte_integers_truncates_and_wraps(to):
    """Sub-byte integers are carried as int32; onnx's reference (ml_dtypes) truncates and wraps."""
    import onnx
    from onnx_cases import check_reference

    x = np.array([-9.7, -8, -3.5, -1, 0, 1.9, 3, 7, 8, 15.2, 16], np.float32)
    model = single_node_model("Cast", {"x": x}, attrs={"to": getattr(onnx.TensorProto, to)}, opset=21)
    check_reference(model, {"x": x})


def test_cast_from_int4_input():
    import ml_dtypes
    from onnx_cases import check_reference

    x = np.array([-8, -1, 0, 7], ml_dtypes.int4)
    model = single_node_model("Cast", {"x": x}, attrs={"to": 1}, opset=21)
    check_reference(model, {"x": x})
