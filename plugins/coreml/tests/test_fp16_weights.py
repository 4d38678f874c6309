"""Weights cast to fp16 once, with the overflow check on the result: the same program as
coremltools' own cast pass makes."""

from __future__ import annotations

import copy
import sys

import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types
from coremltools.converters.mil.mil.passes.defs.quantization import add_fp16_cast

from edgebuild_coreml.lowering import fp16_weights
from edgebuild_coreml.lowering.passes import guarded_fp16_cast

RNG = np.random.default_rng(7)
torch = pytest.importorskip("torch")
CASTERS = pytest.mark.parametrize("caster", [None, torch], ids=["numpy", "torch"])


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch):
    """Steps small enough that the test arrays are cut into several, at their edges too, on both threads."""
    monkeypatch.setattr(fp16_weights, "CHUNK_ELEMENTS", 1000)
    monkeypatch.setattr(fp16_weights, "TILE", 16)
    monkeypatch.setattr(fp16_weights, "BAND_ROWS", 16)


@CASTERS
@pytest.mark.parametrize("make", [
    lambda a: a,  # C order
    lambda a: a.T,  # a transposed view: cast into C order a tile (a band) at a time
    lambda a: a[:, ::2],  # not dense: the plain cast
    lambda a: a.reshape(4, 24, 130),  # C order, three dimensions
], ids=["c-order", "transposed", "strided", "3-d"])
def test_chunked_cast_equals_astype(make, caster):
    value = make(RNG.standard_normal((96, 130)).astype(np.float32) * 100)
    value.flat[::97] = RNG.standard_normal(value.flat[::97].size).astype(np.float32) * 1e-6  # subnormal in fp16
    fp16, became_inf = fp16_weights.cast_checked(value, caster)
    assert fp16.dtype == np.float16 and fp16.shape == value.shape and not became_inf
    np.testing.assert_array_equal(fp16, value.astype(np.float16))


@CASTERS
def test_a_transposed_matrix_is_cast_into_c_order(caster):
    value = (RNG.standard_normal((90, 70)).astype(np.float32) * 100).T
    value[3, 60] = 7e4
    fp16, became_inf = fp16_weights.cast_checked(value, caster)
    assert fp16.flags.c_contiguous and became_inf
    np.testing.assert_array_equal(fp16, value.astype(np.float16))
    fp32 = fp16_weights.in_c_order(value)
    assert fp32.dtype == np.float32 and fp32.flags.c_contiguous
    np.testing.assert_array_equal(fp32, value)


@CASTERS
@pytest.mark.parametrize("layout", ["c-order", "transposed"])
@pytest.mark.parametrize("special", [7e4, -7e4, np.inf], ids=["over", "under", "inf"])
def test_chunked_cast_sees_inf_in_any_chunk(caster, layout, special):
    value = RNG.standard_normal((64, 100)).astype(np.float32)
    value[50, 7] = special
    assert fp16_weights.cast_checked(value if layout == "c-order" else value.T, caster)[1]
    value[3, 3] = np.nan  # a NaN hides the extremes: inf is still found
    assert fp16_weights.cast_checked(value if layout == "c-order" else value.T, caster)[1]
    value[50, 7] = 1.0
    assert not fp16_weights.cast_checked(value if layout == "c-order" else value.T, caster)[1]


def test_torch_casts_when_imported_or_worth_its_import(monkeypatch):
    assert fp16_weights.half_caster(fp16_weights.TORCH_MIN_BYTES) is torch  # imported: free to use
    assert fp16_weights.half_caster(fp16_weights.TORCH_MIN_BYTES - 1) is None  # numpy's casts are as quick
    monkeypatch.setitem(sys.modules, "torch", None)  # not imported, and not importable
    assert fp16_weights.half_caster(fp16_weights.TORCH_MIN_BYTES) is None
    assert fp16_weights.half_caster(fp16_weights.TORCH_WORTH_BYTES) is None


def _program(weight: np.ndarray):
    @mb.program(input_specs=[mb.TensorSpec(shape=(2, weight.shape[0]))])
    def prog(x):
        return mb.matmul(x=x, y=weight, name="mm")

    return prog


def _summary(prog) -> list:
    """Each op's type, name, output dtype and (for a const) its value; the dtype strings of casts
    are named from a process-wide counter, so not by name."""
    found = []
    for op in prog.functions["main"].operations:
        value = op.outputs[0].val if op.op_type == "const" else None
        name = None if isinstance(value, str) else op.name
        found.append((op.op_type, name, types.builtin_to_string(op.outputs[0].dtype),
                      None if value is None else np.asarray(value).tobytes()))
    return found


def _cast_both_ways(weight):
    prog = _program(weight)
    theirs = copy.deepcopy(prog)
    add_fp16_cast().apply(theirs)
    guarded_fp16_cast().apply(prog)
    return prog, theirs


@pytest.mark.parametrize("special", [None, 7e4, -3.4e38], ids=["fits", "out-of-range", "meant-as-infinity"])
def test_cast_pass_gives_coremltools_program(special):
    weight = RNG.standard_normal((64, 80)).astype(np.float32)  # above fp16_weights.MIN_ELEMENTS
    if special is not None:
        weight[3, 5] = special
    ours, theirs = _cast_both_ways(weight)
    # coremltools leaves const -> cast pairs for const_elimination; ours folds each as it goes
    from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY

    for prog in (ours, theirs):
        PASS_REGISTRY["common::const_elimination"](prog)
        PASS_REGISTRY["common::dead_code_elimination"](prog)
    assert _summary(ours) == _summary(theirs)
    mm = next(op for op in ours.functions["main"].operations if op.op_type == "matmul")
    assert types.builtin_to_string(mm.outputs[0].dtype) == ("fp32" if special == 7e4 else "fp16")


def test_the_cast_value_is_restored_after_the_pass():
    from coremltools.converters.mil.mil.ops.defs.iOS15.elementwise_unary import cast

    before = cast.__dict__["get_cast_value"]
    guarded_fp16_cast().apply(_program(RNG.standard_normal((64, 80)).astype(np.float32)))
    assert cast.__dict__["get_cast_value"] is before
