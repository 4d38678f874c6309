"""Compressed weights in the MIL interpreter: constexpr ops from coremltools' int8,
palettising, pruning and joint compression, expanded to dense weights.
"""

from __future__ import annotations

import numpy as np
import pytest

ct = pytest.importorskip("coremltools")
from coremltools.converters.mil import Builder as mb  # noqa: E402
from interpreter_programs import FP32, spec  # noqa: E402

from edgebuild_coreml.interpreter import load_mlpackage, run_mlpackage  # noqa: E402

RNG = np.random.default_rng(0)


W = RNG.standard_normal((64, 48)).astype(np.float32)


def _weight_program():
    @mb.program(input_specs=[spec((64, 48))], opset_version=ct.target.iOS17)
    def prog(x):
        return mb.mul(x=x, y=W, name="out")

    return prog


def _compressed_package(tmp_path, compress, target):
    model = ct.convert(
        _weight_program(), convert_to="mlprogram", minimum_deployment_target=target,
        compute_precision=FP32, skip_model_load=True,
    )
    compressed = compress(model)
    path = tmp_path / "c.mlpackage"
    compressed.save(str(path))
    op_types = {op.op_type for op in load_mlpackage(path).functions["main"].operations}
    dense = run_mlpackage(path, {"x": np.ones((64, 48), np.float32)})["out"]
    return op_types, dense


@pytest.mark.parametrize("target", [ct.target.iOS17, ct.target.iOS18])
def test_int8_linear_quantized_weights(tmp_path, target):
    from coremltools.optimize import coreml as cto

    config = cto.OptimizationConfig(
        global_config=cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int8", granularity="per_channel")
    )
    op_types, dense = _compressed_package(tmp_path, lambda m: cto.linear_quantize_weights(m, config), target)
    expected_op = "constexpr_affine_dequantize" if target == ct.target.iOS17 else "constexpr_blockwise_shift_scale"
    assert expected_op in op_types
    # Symmetric int8: every weight within half a step of its channel's scale.
    scale = np.abs(W).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(dense - W) <= scale / 2 + 1e-6)
    assert not np.array_equal(dense, W)


@pytest.mark.parametrize("target", [ct.target.iOS17, ct.target.iOS18])
def test_palettized_weights(tmp_path, target):
    from coremltools.optimize import coreml as cto

    config = cto.OptimizationConfig(global_config=cto.OpPalettizerConfig(mode="uniform", nbits=4))
    op_types, dense = _compressed_package(tmp_path, lambda m: cto.palettize_weights(m, config), target)
    assert "constexpr_lut_to_dense" in op_types
    assert len(np.unique(dense)) <= 16
    # Uniform 4-bit LUT over [min, max]: each weight within half a step of a palette entry.
    step = (W.max() - W.min()) / 15
    assert np.max(np.abs(dense - W)) <= step / 2 + 1e-5


@pytest.mark.parametrize("target", [ct.target.iOS17, ct.target.iOS18])
def test_pruned_weights(tmp_path, target):
    from coremltools.optimize import coreml as cto

    config = cto.OptimizationConfig(global_config=cto.OpMagnitudePrunerConfig(target_sparsity=0.5))
    op_types, dense = _compressed_package(tmp_path, lambda m: cto.prune_weights(m, config), target)
    assert "constexpr_sparse_to_dense" in op_types
    kept = dense != 0
    assert abs(kept.mean() - 0.5) < 0.01
    np.testing.assert_array_equal(dense[kept], W[kept])
    # Magnitude pruning keeps the large weights.
    assert np.abs(W[kept]).min() >= np.abs(W[~kept]).max()


def test_joint_sparse_palettized_weights_ios18(tmp_path):
    from coremltools.optimize import coreml as cto

    def compress(model):
        pruned = cto.prune_weights(model, cto.OptimizationConfig(global_config=cto.OpMagnitudePrunerConfig(target_sparsity=0.5)))
        config = cto.OptimizationConfig(global_config=cto.OpPalettizerConfig(mode="uniform", nbits=4))
        return cto.palettize_weights(pruned, config, joint_compression=True)

    op_types, dense = _compressed_package(tmp_path, compress, ct.target.iOS18)
    assert "constexpr_lut_to_sparse" in op_types
    kept = dense != 0
    assert abs(kept.mean() - 0.5) < 0.01
    assert len(np.unique(dense[kept])) <= 16
    nonzero = W[kept]
    step = (nonzero.max() - nonzero.min()) / 15
    assert np.max(np.abs(dense[kept] - nonzero)) <= step / 2 + 1e-5


@pytest.mark.parametrize("dtype,axis,scale_dtype", [(np.int8, 0, np.float32), (np.uint8, 1, np.float16), (np.int8, -1, np.float16)])
def test_affine_dequantize_matches_coremltools(dtype, axis, scale_dtype):
    from coremltools.converters.mil.mil.ops.defs.iOS16.constexpr_ops import constexpr_affine_dequantize

    from edgebuild_coreml.interpreter.ops_constexpr import affine_dequantize

    info = np.iinfo(dtype)
    data = RNG.integers(info.min, info.max + 1, size=(6, 5)).astype(dtype)
    channels = data.shape[axis]
    zero_point = RNG.integers(info.min, info.max + 1, size=channels).astype(dtype)
    scale = (RNG.random(channels) * 0.1 + 0.01).astype(scale_dtype)
    args = {"quantized_data": data, "zero_point": zero_point, "scale": scale, "axis": axis}
    got = affine_dequantize(None, args)
    expected = constexpr_affine_dequantize.decompress(data, zero_point, scale, axis)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("data_type,offset", [("int4", None), ("uint4", "uint4"), ("uint4", "fp32"), ("uint8", "uint8")])
def test_blockwise_sub_byte_weights_read_back(tmp_path, data_type, offset):
    """4-bit blockwise weights (as MatMulNBits lowers to) survive the package's sub-byte
    storage: data, offsets of the data's type or float offsets, scales per block of 16."""
    from coremltools.converters.mil.mil import types
    from interpreter_programs import roundtrip

    low, high = {"int4": (-8, 8), "uint4": (0, 16), "uint8": (0, 256)}[data_type]
    storage = {"int4": types.np_int4_dtype, "uint4": types.np_uint4_dtype, "uint8": np.uint8}[data_type]
    codes = RNG.integers(low, high, (8, 64))
    scale = (RNG.random((8, 4)) * 0.1 + 0.01).astype(np.float32)
    zero = {None: None, "fp32": (RNG.random((8, 4)) * (high - 1)).astype(np.float32),
            data_type: RNG.integers(low, high, (8, 4))}[offset]
    kwargs = {} if zero is None else {"offset": zero.astype(storage) if offset == data_type else zero}

    @mb.program(input_specs=[spec((2, 64))], opset_version=ct.target.iOS18)
    def prog(x):
        weight = mb.constexpr_blockwise_shift_scale(data=codes.astype(storage), scale=scale, **kwargs)
        return mb.linear(x=x, weight=weight, bias=np.zeros(8, np.float32), name="out")

    x = RNG.standard_normal((2, 64)).astype(np.float32)
    dense = (codes - (0 if zero is None else np.repeat(zero, 16, axis=1))) * np.repeat(scale, 16, axis=1)
    got = roundtrip(prog, tmp_path, {"x": x}, target=ct.target.iOS18)["out"]
    np.testing.assert_allclose(got, x @ dense.T, rtol=1e-5, atol=1e-5)
