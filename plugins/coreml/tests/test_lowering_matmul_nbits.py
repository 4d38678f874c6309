"""com.microsoft MatMulNBits (lowering/ops/contrib_matmul_nbits.py) against onnxruntime.

Graphs come from onnxruntime's own weight-only quantiser (MatMulNBitsQuantizer: RTN at 4 and 8
bits, block sizes 32 and 128, symmetric and asymmetric; HQQ for float zero points) applied to
a float MatMul. Cases the quantiser does not write (a bias, g_idx act-order, 2 bits) are built
from the op's documented layout. Each runs the way ``edgebuild conformance`` runs a case and is
compared with onnxruntime; the weight must stay 4-bit (or 8-bit) in the program and in a saved
package, which the MIL interpreter reads back.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest
from contrib_cases import MS, assert_close, run_like_conformance
from onnx_cases import IR_VERSION, lower, rand, run_onnxruntime

from edgebuild_coreml.lowering.errors import TargetTooOld

N = 48


def _float_matmul(k: int, a_shape=(2, 3), seed: int = 0) -> onnx.ModelProto:
    weight = rand(k, N, seed=seed + 1)
    node = oh.make_node("MatMul", ["a", "w"], ["y"], name="proj")
    graph = oh.make_graph([node], "g", [oh.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [*a_shape, k])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [*a_shape, N])],
                          [onh.from_array(weight, "w")])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=IR_VERSION)


def quantised(model: onnx.ModelProto, *, bits=4, block_size=32, symmetric=False, hqq=False) -> onnx.ModelProto:
    """``model`` with its MatMul weights quantised by onnxruntime's MatMulNBitsQuantizer."""
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        HQQWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    if hqq:
        config = HQQWeightOnlyQuantConfig(block_size=block_size, bits=bits)
    else:
        config = DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=symmetric, bits=bits)
    quantizer = MatMulNBitsQuantizer(model, algo_config=config)
    quantizer.process()
    result = quantizer.model.model
    assert [n.op_type for n in result.graph.node] == ["MatMulNBits"]
    return result


def _program_ops(model, target="iOS18"):
    return list(lower(model, target=target).program.functions["main"].operations)


def _check(model, a, *, max_abs=1e-4):
    expected = run_onnxruntime(model, {"a": a})["y"]
    actual = run_like_conformance(model, {"a": a})["y"]
    assert_close(actual, expected, max_abs=max_abs, name="y")
    return actual


def _weight_dtypes(model):
    """The MIL dtypes of the constexpr weights' data and offset."""
    from coremltools.converters.mil.mil import types

    [op] = [op for op in _program_ops(model) if op.op_type == "constexpr_blockwise_shift_scale"]
    offset = op.inputs.get("offset")
    return types.builtin_to_string(op.data.dtype), None if offset is None else types.builtin_to_string(offset.dtype)


# -- onnxruntime's quantiser ----------------------------------------------------------------
@pytest.mark.parametrize("block_size", [32, 128])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("bits", [4, 8])
def test_quantizer_output_matches_onnxruntime(block_size, symmetric, bits):
    model = quantised(_float_matmul(256), bits=bits, block_size=block_size, symmetric=symmetric)
    _check(model, rand(2, 3, 256, seed=5))
    data, offset = _weight_dtypes(model)
    narrow = "4" if bits == 4 else "8"
    assert data == (f"int{narrow}" if symmetric else f"uint{narrow}")
    assert offset == (None if symmetric else f"uint{narrow}")


@pytest.mark.parametrize("k,block_size", [(200, 32), (96, 128)])
def test_k_not_a_multiple_of_the_block(k, block_size):
    """The quantiser pads the last block; A gets zeros there."""
    model = quantised(_float_matmul(k), block_size=block_size)
    _check(model, rand(2, 3, k, seed=5))
    assert "pad" in [op.op_type for op in _program_ops(model)]


def test_float_zero_points_from_hqq():
    """HQQ writes float zero points (and flat scales): a float offset on the 4-bit codes."""
    pytest.importorskip("torch")
    model = quantised(_float_matmul(256), block_size=64, hqq=True)
    assert onh.to_array(next(t for t in model.graph.initializer if "zero" in t.name)).dtype == np.float32
    _check(model, rand(2, 3, 256, seed=5))
    assert _weight_dtypes(model) == ("uint4", "fp32")


@pytest.mark.parametrize("a_shape", [(7,), (5, 2, 3)])
def test_input_ranks(a_shape):
    """A vector and a rank-4 A (MIL's linear takes rank <= 3: a matmul then)."""
    model = quantised(_float_matmul(64, a_shape=a_shape), block_size=32)
    _check(model, rand(*a_shape, 64, seed=5))


@pytest.mark.parametrize("hqq", [False, True])
def test_float16_source(hqq):
    """A float16 graph (A, scales, float zero points in fp16): the weight comes out in fp16 too."""
    if hqq:
        pytest.importorskip("torch")
    model = quantised(_float_matmul(128), block_size=32, hqq=hqq)
    for tensor in model.graph.initializer:
        if tensor.data_type == onnx.TensorProto.FLOAT:
            tensor.CopyFrom(onh.from_array(onh.to_array(tensor).astype(np.float16), tensor.name))
    for value in [*model.graph.input, *model.graph.output]:
        value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    a = rand(2, 3, 128, seed=5).astype(np.float16)
    expected = run_onnxruntime(model, {"a": a})["y"].astype(np.float32)
    actual = run_like_conformance(model, {"a": a})["y"]
    assert actual.dtype == np.float16
    assert_close(actual.astype(np.float32), expected, max_abs=2e-3, name="y")  # fp16 resolution


# -- cases built from the documented layout -------------------------------------------------
RNG = np.random.default_rng(3)


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """[rows, count] codes -> uint8 bytes, ``8 // bits`` codes each, low bits first."""
    per_byte = 8 // bits
    rows, count = codes.shape
    padded = np.zeros((rows, -(-count // per_byte) * per_byte), np.uint8)
    padded[:, :count] = codes
    grouped = padded.reshape(rows, -1, per_byte)
    return np.bitwise_or.reduce([grouped[..., j] << np.uint8(bits * j) for j in range(per_byte)], axis=0).astype(np.uint8)


def _layout_case(k=64, block=16, bits=4, *, zero="packed", g_idx=False, bias=False):
    """(model, codes, scales, zero points, g_idx, bias): a MatMulNBits node from its documented layout."""
    blocks = -(-k // block)
    codes = RNG.integers(0, 1 << bits, (N, blocks * block)).astype(np.uint8)
    scales = rand(N, blocks, seed=11, low=0.01, high=0.1)
    zeros = {"packed": RNG.integers(0, 1 << bits, (N, blocks)).astype(np.uint8),
             "float": rand(N, blocks, seed=12, low=0.0, high=(1 << bits) - 1), None: None}[zero]
    groups = np.repeat(np.arange(blocks), block)[:k].astype(np.int32)
    if g_idx:
        RNG.shuffle(groups)
    bias_value = rand(N, seed=13) if bias else None
    initializers = {"B": pack(codes, bits).reshape(N, blocks, -1), "scales": scales,
                    "zero_points": None if zeros is None else (pack(zeros, bits) if zero == "packed" else zeros),
                    "g_idx": groups if g_idx else None, "bias": bias_value}
    names = [name if value is not None else "" for name, value in initializers.items()]
    while names[-1] == "":
        names.pop()
    node = oh.make_node("MatMulNBits", ["a", *names], ["y"], domain=MS, name="proj", K=k, N=N, bits=bits,
                        block_size=block)
    graph = oh.make_graph([node], "g", [oh.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [3, k])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, N])],
                          [onh.from_array(v, name) for name, v in initializers.items() if v is not None])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid(MS, 1)], ir_version=IR_VERSION)
    return model, codes, scales, zeros, groups, bias_value


def _reference(a, k, bits, codes, scales, zeros, groups, bias):
    """The documented arithmetic: y = a @ ((code - zero[n, g(k)]) * scale[n, g(k)]).T + bias."""
    zero = np.full(scales.shape, 1 << (bits - 1), np.float64) if zeros is None else zeros.astype(np.float64)
    weight = (codes[:, :k] - zero[:, groups]) * scales[:, groups]
    return a.astype(np.float64) @ weight.T + (0 if bias is None else bias)


@pytest.mark.parametrize("zero", ["packed", "float", None])
def test_bias(zero):
    model, *_ = _layout_case(zero=zero, bias=True)
    _check(model, rand(3, 64, seed=5))


@pytest.mark.parametrize("zero", ["packed", "float", None])
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_layout_against_onnxruntime(zero, bits):
    if bits == 8 and zero == "float":
        pytest.skip("onnxruntime's CPU kernel refuses 8-bit weights with float zero points")
    model, *_ = _layout_case(k=80, block=32, bits=bits, zero=zero)
    _check(model, rand(3, 80, seed=5))
    if bits == 2:  # Core ML has no 2-bit shift-scale data: the codes travel as 4-bit
        assert _weight_dtypes(model)[0] in ("int4", "uint4")


@pytest.mark.parametrize("zero", ["float", None])
@pytest.mark.parametrize("k", [64, 72])
def test_g_idx_act_order_matches_onnxruntime(zero, k):
    """Rows of a block scattered over K: A's last axis and the weight's K rows are permuted alike."""
    model, *_ = _layout_case(k=k, block=16, zero=zero, g_idx=True)
    a = rand(3, k, seed=5)
    _check(model, a)
    assert "gather" in [op.op_type for op in _program_ops(model)]


def test_g_idx_with_packed_zero_points_follows_the_documented_arithmetic():
    """onnxruntime's CPU kernel (1.2x) ignores packed zero points when g_idx is given (it uses
    2^(bits-1)), unlike its other paths and the op's documentation; the lowering follows the
    documentation, so this case is checked against that arithmetic instead."""
    model, codes, scales, zeros, groups, bias = _layout_case(k=64, block=16, zero="packed", g_idx=True)
    a = rand(3, 64, seed=5)
    actual = run_like_conformance(model, {"a": a})["y"]
    assert_close(actual, _reference(a, 64, 4, codes, scales, zeros, groups, bias), max_abs=1e-4, name="y")


def test_g_idx_that_does_not_fill_blocks_is_refused():
    model, *_ = _layout_case(k=64, block=16, g_idx=True)
    [g] = [t for t in model.graph.initializer if t.name == "g_idx"]
    g.CopyFrom(onh.from_array(np.zeros(64, np.int32), "g_idx"))
    from edgebuild_coreml.lowering.errors import LoweringError

    with pytest.raises(LoweringError, match=r"'proj'.*g_idx must put exactly block_size \(16\) rows"):
        run_like_conformance(model, {"a": rand(3, 64)})


# -- targets and packages -------------------------------------------------------------------
@pytest.mark.parametrize("target", ["iOS16", "iOS17"])
def test_older_targets_are_refused(target):
    model = quantised(_float_matmul(64))
    with pytest.raises(TargetTooOld, match=r"'proj_Q4' \(com.microsoft::MatMulNBits\) needs deployment target iOS18") as info:
        lower(model, target=target)
    assert info.value.hint == "set target.deployment_target: iOS18"


@pytest.mark.parametrize("precision", ["float32", "float16"])
def test_package_keeps_4_bit_weights(tmp_path, precision):
    """Saved and read back: the weight file holds the codes at 4 bits, and the interpreter runs it."""
    from edgebuild_coreml.interpreter import load_mlpackage, run_mlpackage
    from edgebuild_coreml.lowering.package import save_mlpackage

    k, n = 512, N
    model = quantised(_float_matmul(k), block_size=32, symmetric=False)
    path = tmp_path / "m.mlpackage"
    save_mlpackage(lower(model, precision=precision), path, target="iOS18", precision=precision, metadata={})
    assert "constexpr_blockwise_shift_scale" in {op.op_type for op in load_mlpackage(path).functions["main"].operations}
    weights = sum(f.stat().st_size for f in path.rglob("weight.bin"))
    dense = k * n * (4 if precision == "float32" else 2)
    # codes at 4 bits plus one scale and one 4-bit zero point per block of 32, with the file's alignment
    assert weights < k * n / 2 + dense / 16 + 4096, (weights, dense)
    a = rand(2, 3, k, seed=5)
    expected = run_onnxruntime(model, {"a": a})["y"]
    actual = run_mlpackage(path, {"a": a})["y"]
    assert_close(actual, expected, max_abs=1e-4 if precision == "float32" else 2e-2, name="y")
