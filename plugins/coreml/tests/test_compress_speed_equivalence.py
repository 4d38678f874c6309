"""The faster forms of linear weight quantisation store exactly the bytes of the plain ones.

``spec_linear`` reduces blocks by folding them in halves and quantises large weights in slices on
two threads; both are only allowed to change the time taken. Each is checked against the plain
formulation (numpy's reductions over the block axes, the whole tensor at once) on every mode,
dtype, granularity and weight rank the path takes, and the weight file of a package compressed
both ways is compared byte for byte.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from edgebuild_coreml.compress import spec_linear
from edgebuild_coreml.compress.config import LinearWeights

WEIGHTS = Path("Data") / "com.apple.CoreML" / "weights" / "weight.bin"

# (shape, block sizes per axis) as _block_sizes gives them: linear [out, in], conv [out, in, kh, kw],
# conv_transpose [in, out, ...], matmul's y [in, out]
LAYOUTS = {
    "per_tensor": [((96, 64), [0, 0]), ((16, 8, 3, 3), [0, 0, 0, 0])],
    "per_channel": [((96, 64), [1, 0]), ((16, 8, 3, 3), [1, 0, 0, 0]), ((64, 96), [0, 1]),
                    ((8, 16, 3, 3), [0, 1, 0, 0])],
    "per_block": [((96, 64), [1, 32]), ((96, 64), [1, 16]), ((96, 48), [1, 8]), ((96, 24), [1, 24]),
                  ((16, 64, 3, 3), [1, 32, 0, 0]), ((64, 96), [16, 1]), ((64, 16, 3, 3), [16, 1, 0, 0])],
}
CONFIGS = [LinearWeights(mode="linear", dtype=dtype, symmetric=symmetric)
           for dtype, symmetric in itertools.product(["int8", "int4", "uint8", "uint4"], [True, False])]


def plain_quantize(weight: np.ndarray, config: LinearWeights, block_sizes: list[int]):
    """The rule as first written: numpy's min and max over each block, the whole tensor at once."""
    blocked, scale_shape, axes = [], [], []
    for dim, block in zip(weight.shape, block_sizes):
        blocked += [dim // block, block] if block else [dim]
        scale_shape.append(dim // block if block else 1)
        axes.append(len(blocked) - 1)
    values = weight.astype(np.float32).reshape(blocked)
    low_q, high_q = spec_linear.quant_range(config.dtype, config.symmetric)
    low = values.min(axis=tuple(axes), keepdims=True)
    high = values.max(axis=tuple(axes), keepdims=True)
    offset = None
    if config.symmetric:
        bound = np.maximum(-low, high)
        low, high = -bound, bound
    else:
        low, high = np.minimum(low, 0.0), np.maximum(high, 0.0)
    scale = (high - low) / (high_q - low_q)
    scale = np.where(scale > 0, scale, 1.0).astype(weight.dtype).astype(np.float32)
    if config.dtype.startswith("u") and config.symmetric:
        offset = np.full(scale.shape, (high_q + 1) // 2, dtype=np.float32)
    elif not config.symmetric:
        offset = np.clip(np.round(low_q - low / scale), low_q, high_q)
    data = np.round(values / scale)
    if offset is not None:
        data = data + offset
    int_type = np.uint8 if config.dtype.startswith("u") else np.int8
    data = np.clip(data, low_q, high_q).astype(int_type).reshape(weight.shape)
    scale = scale.astype(weight.dtype).reshape(scale_shape)
    return data, scale, None if offset is None else offset.astype(int_type).reshape(scale_shape)


def weights_with_edge_blocks(shape, dtype, seed: int) -> np.ndarray:
    """Gaussian weights with the blocks that test the range rule: all zero, all positive, all
    negative, signed zeros, and a value at the top of the dtype's range."""
    rng = np.random.default_rng(seed)
    weight = (rng.standard_normal(shape) * 0.02).astype(dtype)
    flat = weight.reshape(shape[0], -1)
    flat[0] = 0
    flat[1] = np.abs(flat[1])
    flat[2] = -np.abs(flat[2])
    flat[3, ::2] = -0.0
    flat[3, 1::2] = 0.0
    flat[4, 0] = 3e4  # far out of the others' range, and still finite in fp16
    return weight


def _same_bytes(ours, plain) -> None:
    for part, (a, b) in zip(("data", "scale", "offset"), zip(ours, plain)):
        assert (a is None) == (b is None), part
        if a is not None:
            assert a.shape == b.shape and a.dtype == b.dtype, part
            assert a.tobytes() == b.tobytes(), part


@pytest.mark.parametrize("granularity", sorted(LAYOUTS))
@pytest.mark.parametrize("float_type", [np.float16, np.float32])
def test_block_folding_quantises_every_layout_as_the_plain_rule(granularity, float_type):
    for (shape, block_sizes), config in itertools.product(LAYOUTS[granularity], CONFIGS):
        weight = weights_with_edge_blocks(shape, float_type, seed=len(shape) + sum(block_sizes))
        ours = spec_linear._quantize_blockwise(weight, config, block_sizes)
        _same_bytes(ours, plain_quantize(weight, config, block_sizes))
        assert spec_linear.stored_bytes(ours[0], config.dtype).tobytes() == \
            spec_linear.stored_bytes(plain_quantize(weight, config, block_sizes)[0], config.dtype).tobytes()


@pytest.mark.parametrize("axis_and_blocks", [(0, [1, 32]), (0, [1, 0]), (1, [0, 1]), (1, [16, 1])])
def test_sliced_threaded_quantisation_matches_the_whole_tensor(monkeypatch, axis_and_blocks):
    """A weight above SPLIT_ELEMENTS is quantised in slices on threads: the same bytes, whichever
    axis is sliced and whether the slice count divides it."""
    _, block_sizes = axis_and_blocks
    monkeypatch.setattr(spec_linear, "SPLIT_ELEMENTS", 1000)
    weight = weights_with_edge_blocks((160, 96) if block_sizes[0] != 16 else (96, 160), np.float16, seed=7)
    for config in CONFIGS:
        _same_bytes(spec_linear.quantize_blockwise(weight, config, block_sizes),
                    plain_quantize(weight, config, block_sizes))


def test_block_extreme_is_numpys_reduction_on_odd_and_nan_blocks():
    rng = np.random.default_rng(3)
    for shape, axes in [((6, 5, 24), (2,)), ((6, 3, 7), (2,)), ((4, 1, 64), (1, 2)), ((5, 4, 2, 9), (1, 3))]:
        values = rng.standard_normal(shape).astype(np.float32)
        values.reshape(-1)[::17] = np.nan
        for op in (np.minimum, np.maximum):
            np.testing.assert_array_equal(spec_linear.block_extreme(values, axes, op),
                                          op.reduce(values, axis=axes, keepdims=True))


@pytest.fixture(scope="module")
def fp16_package(tmp_path_factory) -> Path:
    """An iOS18 fp16 program with a linear, a conv and a matmul weight."""
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb

    rng = np.random.default_rng(0)
    linear = weights_with_edge_blocks((128, 64), np.float32, seed=1)
    conv = (rng.standard_normal((32, 8, 3, 3)) * 0.05).astype(np.float32)
    project = (rng.standard_normal((64, 96)) * 0.02).astype(np.float32)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 8, 8, 8))], opset_version=ct.target.iOS18)
    def program(x):
        y = mb.conv(x=x, weight=conv, pad_type="same", name="conv")
        y = mb.reshape(x=y, shape=[1, 32, 64])
        y = mb.linear(x=y, weight=linear, name="fc")
        return mb.matmul(x=mb.slice_by_size(x=y, begin=[0, 0, 0], size=[1, 32, 64]), y=project, name="proj")

    model = ct.convert(program, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS18,
                       compute_precision=ct.precision.FLOAT16, skip_model_load=True)
    path = tmp_path_factory.mktemp("fp16") / "model.mlpackage"
    model.save(str(path))
    return path


@pytest.mark.parametrize("weights", [
    {"mode": "linear", "dtype": "int4", "granularity": "per_block", "block_size": 32},
    {"mode": "linear", "dtype": "uint4", "granularity": "per_block", "block_size": 8, "symmetric": False},
    {"mode": "linear", "dtype": "int8", "granularity": "per_channel"},
    {"mode": "linear", "dtype": "uint8", "granularity": "per_tensor", "symmetric": False},
])
def test_package_weight_file_is_byte_identical_to_the_plain_rule(fp16_package, tmp_path, monkeypatch, weights):
    from edgebuild_coreml.compress.apply import compress_mlpackage
    from edgebuild_coreml.compress.config import validate_compression

    section = validate_compression({"weights": weights}, target="iOS18")
    fast = compress_mlpackage(fp16_package, tmp_path / "fast.mlpackage", section)
    monkeypatch.setattr(spec_linear, "_quantize_blockwise", plain_quantize)
    plain = compress_mlpackage(fp16_package, tmp_path / "plain.mlpackage", section)
    assert fast["bytes_after"] == plain["bytes_after"] < fast["bytes_before"]
    assert (tmp_path / "fast.mlpackage" / WEIGHTS).read_bytes() == (tmp_path / "plain.mlpackage" / WEIGHTS).read_bytes()
    assert [w["mode"] for w in fast["weights"]].count(next(w["mode"] for w in fast["weights"]
                                                          if w["mode"] != "fp16")) >= 2
