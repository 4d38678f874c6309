"""Compression section validation, target gating, and every mode applied to a real .mlpackage."""

import numpy as np
import pytest
from pydantic import ValidationError

import coremltools as ct
from coremltools.converters.mil import Builder as mb

from edgebuild.errors import RecipeError
from edgebuild_coreml.compress.apply import compress_mlpackage
from edgebuild_coreml.compress.config import validate_compression
from edgebuild_coreml.compress.gating import check_deployment_target
from edgebuild_coreml.compress.program import iter_ops, load_program

CONV = "stem_conv"
LINEAR = "head_fc"


@pytest.fixture(scope="module")
def small_package(tmp_path_factory):
    """conv (32x16x3x3 = 4608 weights) then linear (64x512): both above weight_threshold."""
    rng = np.random.default_rng(0)
    conv_weight = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    linear_weight = rng.standard_normal((64, 512)).astype(np.float32)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 16, 6, 6))], opset_version=ct.target.iOS18)
    def program(x):
        y = mb.conv(x=x, weight=conv_weight, name=CONV)
        y = mb.reduce_mean(x=y, axes=[2, 3], keep_dims=False)
        y = mb.concat(values=[y] * 16, axis=1)
        return mb.linear(x=y, weight=linear_weight, name=LINEAR)

    model = ct.convert(
        program,
        convert_to="mlprogram",
        minimum_deployment_target=ct.target.iOS18,
        compute_precision=ct.precision.FLOAT16,
        skip_model_load=True,
    )
    path = tmp_path_factory.mktemp("model") / "small.mlpackage"
    model.save(str(path))
    return path, {CONV: conv_weight, LINEAR: linear_weight}


def _compress(small_package, tmp_path, section, target="iOS18"):
    src, _ = small_package
    dst = tmp_path / "out.mlpackage"
    report = compress_mlpackage(src, dst, validate_compression(section, target=target))
    program = load_program(ct.models.MLModel(str(dst), skip_model_load=True))
    return report, program


def _weight_chain(program, op_name):
    """Types of the constexpr ops producing the weight of the op whose name starts with op_name."""
    op = next(o for o in iter_ops(program) if o.name.startswith(op_name) and "weight" in o.inputs)
    chain, producer = [], op.inputs["weight"].op
    while producer.op_type != "const":
        chain.append(producer)
        inner = [v.op for v in producer.inputs.values() if v.op is not None and v.op.op_type != "const"]
        if not inner:
            break
        producer = inner[0]
    return chain


def _entry(report, op_name):
    return next(w for w in report["weights"] if w["name"].startswith(op_name) and w["name"].endswith(".weight"))


def _lut_op(program, op_name):
    return next(op for op in _weight_chain(program, op_name) if op.op_type.startswith("constexpr_lut"))


def test_per_tensor_palettize_is_4bit_with_16_entries(small_package, tmp_path):
    report, program = _compress(small_package, tmp_path, {"weights": {"mode": "palettize", "nbits": 4}})
    lut_op = _lut_op(program, LINEAR)
    assert lut_op.lut.val.shape[-2] == 16
    assert lut_op.indices.dtype.get_bitwidth() == 4
    entry = _entry(report, LINEAR)
    assert entry["mode"] == "palettize"
    # fp16 -> 4-bit indices: about a quarter, plus the table.
    assert entry["bytes_after"] == 64 * 512 // 2 + 16 * 2

    # Each weight maps to its nearest table entry (up to fp16 rounding of the table).
    _, originals = small_package
    original = originals[LINEAR].astype(np.float16).astype(np.float32)
    lut = lut_op.lut.val.reshape(-1).astype(np.float32)
    dense = lut[lut_op.indices.val.astype(np.intp)]
    nearest = lut[np.argmin(np.abs(original[..., None] - lut), axis=-1)]
    assert np.all(np.abs(original - dense) <= np.abs(original - nearest) + 2e-3)


def test_grouped_palettize_has_one_table_per_group(small_package, tmp_path):
    section = {"weights": {"mode": "palettize", "nbits": 2, "granularity": "per_grouped_channel", "group_size": 16}}
    report, program = _compress(small_package, tmp_path, section)
    lut = _lut_op(program, LINEAR).lut.val
    assert lut.shape[0] == 64 // 16 and lut.shape[-2] == 4
    assert _lut_op(program, CONV).lut.val.shape[0] == 32 // 16
    assert _entry(report, LINEAR)["bytes_after"] < _entry(report, LINEAR)["bytes_before"] / 7


def test_ours_beats_or_matches_coremltools_kmeans(small_package, tmp_path):
    def error(algorithm):
        section = {"weights": {"mode": "palettize", "nbits": 3, "algorithm": algorithm}}
        _, program = _compress(small_package, tmp_path, section)
        lut_op = _lut_op(program, LINEAR)
        dense = lut_op.lut.val.reshape(-1).astype(np.float64)[lut_op.indices.val.astype(np.intp)]
        original = small_package[1][LINEAR].astype(np.float16).astype(np.float64)
        return float(np.mean((dense - original) ** 2))

    assert error("kmeans") <= error("kmeans_coremltools") * 1.001


def test_vector_palettize_uses_vector_table(small_package, tmp_path):
    section = {"weights": {"mode": "palettize", "nbits": 4, "cluster_dim": 2,
                           "granularity": "per_grouped_channel", "group_size": 16}}
    _, program = _compress(small_package, tmp_path, section)
    assert _lut_op(program, LINEAR).lut.val.shape[-1] == 2


@pytest.mark.parametrize(
    "weights, bits",
    [
        ({"mode": "linear", "dtype": "int8"}, 8),
        ({"mode": "linear", "dtype": "int4", "granularity": "per_block", "block_size": 32}, 4),
    ],
)
def test_linear_quantisation(small_package, tmp_path, weights, bits):
    report, program = _compress(small_package, tmp_path, {"weights": weights})
    (dequantize,) = _weight_chain(program, LINEAR)
    assert dequantize.op_type == "constexpr_blockwise_shift_scale"
    assert dequantize.data.dtype.get_bitwidth() == bits
    entry = _entry(report, LINEAR)
    assert entry["mode"] == "linear"
    # Indices plus fp16 scales: one per row, or one per block of 32.
    assert 64 * 512 * bits // 8 < entry["bytes_after"] <= 64 * 512 * bits // 8 + 64 * 16 * 2


def test_magnitude_pruning_reaches_target_sparsity(small_package, tmp_path):
    section = {"weights": {"mode": "prune", "method": "magnitude", "target_sparsity": 0.75}}
    report, program = _compress(small_package, tmp_path, section)
    (sparse,) = _weight_chain(program, LINEAR)
    assert sparse.op_type == "constexpr_sparse_to_dense"
    assert np.mean(sparse.mask.val) == pytest.approx(0.25, abs=0.01)
    assert _entry(report, LINEAR)["mode"] == "prune"


def test_threshold_pruning_keeps_only_large_weights(small_package, tmp_path):
    section = {"weights": {"mode": "prune", "method": "threshold", "threshold": 1.0}}
    _, program = _compress(small_package, tmp_path, section)
    (sparse,) = _weight_chain(program, LINEAR)
    original = small_package[1][LINEAR]
    expected = (np.abs(original.astype(np.float16)) > 1.0).mean()
    assert np.mean(sparse.mask.val) == pytest.approx(expected, abs=0.01)


@pytest.mark.parametrize(
    "then, inner_op",
    [
        ({"mode": "palettize", "nbits": 4}, "constexpr_lut_to_sparse"),
        ({"mode": "linear", "dtype": "int8"}, "constexpr_sparse_blockwise_shift_scale"),
    ],
)
def test_joint_compression(small_package, tmp_path, then, inner_op):
    section = {"weights": {"mode": "prune", "method": "n_m", "n_m": [2, 4], "then": then}}
    report, program = _compress(small_package, tmp_path, section)
    chain_types = [op.op_type for op in _weight_chain(program, LINEAR)]
    assert chain_types[0] == "constexpr_sparse_to_dense" and inner_op in chain_types
    entry = _entry(report, LINEAR)
    assert entry["mode"] == f"prune+{then['mode']}"
    assert entry["bytes_after"] < entry["bytes_before"] / 2


def test_override_by_op_type(small_package, tmp_path):
    section = {
        "weights": {"mode": "palettize", "nbits": 4},
        "overrides": [{"match": {"op_type": "conv"}, "weights": {"mode": "linear", "dtype": "int8"}}],
    }
    report, _ = _compress(small_package, tmp_path, section)
    assert _entry(report, CONV)["mode"] == "linear"
    assert _entry(report, LINEAR)["mode"] == "palettize"


def test_override_by_name_regex_can_leave_ops_uncompressed(small_package, tmp_path):
    section = {
        "weights": {"mode": "linear", "dtype": "int8"},
        "overrides": [{"match": {"name": "head_.*"}, "weights": None}],
    }
    report, _ = _compress(small_package, tmp_path, section)
    assert _entry(report, CONV)["mode"] == "linear"
    linear = _entry(report, LINEAR)
    assert linear["mode"] == "none" and linear["bytes_after"] == linear["bytes_before"]


def test_weight_threshold_skips_small_weights(small_package, tmp_path):
    section = {"weights": {"mode": "linear", "dtype": "int8"}, "weight_threshold": 5000}
    report, _ = _compress(small_package, tmp_path, section)
    assert _entry(report, CONV)["mode"] == "none"  # 4608 elements
    assert _entry(report, LINEAR)["mode"] == "linear"


def test_target_gating_names_feature_and_target():
    section = validate_compression(
        {"weights": {"mode": "linear", "dtype": "int4", "granularity": "per_block"}}
    )
    with pytest.raises(RecipeError, match="4-bit per-block linear quantisation needs iOS18; the recipe targets iOS17"):
        check_deployment_target(section, "iOS17")
    check_deployment_target(section, "macOS15")


@pytest.mark.parametrize(
    "weights, target",
    [
        ({"mode": "palettize", "nbits": 4, "granularity": "per_grouped_channel"}, "iOS17"),
        ({"mode": "palettize", "nbits": 4, "cluster_dim": 2}, "iOS17"),
        ({"mode": "prune", "then": {"mode": "palettize", "nbits": 4}}, "iOS17"),
        ({"mode": "palettize", "nbits": 4}, "iOS15"),
        ({"mode": "palettize", "nbits": 3}, "iOS17"),
    ],
)
def test_target_gating_rejects(weights, target):
    with pytest.raises(RecipeError, match=f"needs iOS1[68]; the recipe targets {target}"):
        check_deployment_target(validate_compression({"weights": weights}), target)


def test_activation_quantisation_needs_ios17():
    section = validate_compression({"activations": {"mode": "linear", "dtype": "int8"}})
    with pytest.raises(RecipeError, match="needs iOS17"):
        check_deployment_target(section, "iOS16")


def test_gating_runs_before_building(small_package, tmp_path):
    with pytest.raises(RecipeError, match="per-grouped-channel palettisation needs iOS18"):
        _compress(small_package, tmp_path, {"weights": {"mode": "palettize", "nbits": 4,
                                                         "granularity": "per_grouped_channel"}}, "iOS17")
    assert not (tmp_path / "out.mlpackage").exists()


def test_nbits_5_is_rejected_with_the_supported_list():
    with pytest.raises(ValidationError) as info:
        validate_compression({"weights": {"mode": "palettize", "nbits": 5}})
    (error,) = info.value.errors()
    assert error["msg"] == "must be one of 1, 2, 3, 4, 6, 8"
    assert error["loc"][-1] == "nbits"


def test_unknown_keys_are_rejected():
    with pytest.raises(ValidationError):
        validate_compression({"weights": {"mode": "linear", "dtype": "int8", "bits": 8}})


# -- the fast palettisation pass ------------------------------------------------------------


def _identity_probe_package(path, target, precision, shape=(48, 64)):
    """y = linear(x, W) with x the identity, so the output is W^T exactly (one product per sum)."""
    out_channels, in_channels = shape
    weight = np.random.default_rng(3).laplace(size=shape).astype(np.float32)

    @mb.program(input_specs=[mb.TensorSpec(shape=(in_channels, in_channels))], opset_version=target)
    def program(x):
        return mb.linear(x=x, weight=weight, name="probe")

    model = ct.convert(program, convert_to="mlprogram", minimum_deployment_target=target,
                       compute_precision=precision, skip_model_load=True)
    model.save(str(path))
    return weight


def _probe_lut_op(path):
    program = load_program(ct.models.MLModel(str(path), skip_model_load=True))
    return next(op for op in iter_ops(program) if op.op_type == "constexpr_lut_to_dense")


def _run_probe(path, in_channels):
    from edgebuild_coreml.interpreter import run_mlpackage

    (output,) = run_mlpackage(path, {"x": np.eye(in_channels, dtype=np.float32)}).values()
    return np.asarray(output).T


@pytest.mark.parametrize("nbits", [1, 2, 3, 4, 6, 8])
def test_fast_pass_ios18_interpreter_sees_exactly_lut_of_indices(tmp_path, nbits):
    src, dst = tmp_path / "src.mlpackage", tmp_path / "dst.mlpackage"
    _identity_probe_package(src, ct.target.iOS18, ct.precision.FLOAT32)
    section = {"weights": {"mode": "palettize", "nbits": nbits,
                           "granularity": "per_grouped_channel", "group_size": 16}}
    compress_mlpackage(src, dst, validate_compression(section, target="iOS18"))

    op = _probe_lut_op(dst)
    indices, lut = op.indices.val.astype(np.intp), op.lut.val
    assert op.indices.dtype.get_bitwidth() == nbits and lut.shape == (3, 1, 1 << nbits, 1)
    # Row r uses table r // 16: dequantise by hand and compare bit for bit.
    expected = np.stack([lut[row // 16, 0, indices[row], 0] for row in range(indices.shape[0])])
    np.testing.assert_array_equal(_run_probe(dst, 64), expected)


@pytest.mark.parametrize("nbits", [1, 2, 4, 6])
def test_fast_pass_ios16_packs_indices_lsb_first(tmp_path, nbits):
    src, dst = tmp_path / "src.mlpackage", tmp_path / "dst.mlpackage"
    weight = _identity_probe_package(src, ct.target.iOS16, ct.precision.FLOAT16)
    compress_mlpackage(src, dst, validate_compression({"weights": {"mode": "palettize", "nbits": nbits}}, target="iOS16"))

    op = _probe_lut_op(dst)
    assert list(op.shape.val) == [48, 64] and op.indices.dtype == ct.converters.mil.mil.types.uint8
    bits = np.unpackbits(op.indices.val, bitorder="little")[: weight.size * nbits].reshape(-1, nbits)
    indices = (bits.astype(np.intp) << np.arange(nbits)).sum(axis=1)
    expected = op.lut.val[indices].reshape(weight.shape).astype(np.float32)
    np.testing.assert_array_equal(_run_probe(dst, 64), expected)
    # Each weight took its nearest entry of the stored table.
    table = op.lut.val.astype(np.float64)
    original = weight.astype(np.float16).astype(np.float64).reshape(-1)
    distance = np.abs(original[:, None] - table[None, :])
    np.testing.assert_array_equal(distance[np.arange(original.size), indices], distance.min(axis=1))


@pytest.mark.parametrize("nbits", [1, 2, 3, 4, 6, 8])
def test_pack_indices_matches_coremltools_packing(nbits):
    from coremltools.optimize._utils import pack_elements_into_bits

    from edgebuild_coreml.compress.packing import pack_indices

    indices = np.random.default_rng(nbits).integers(0, 1 << nbits, size=1001).astype(np.uint8)
    np.testing.assert_array_equal(pack_indices(indices, nbits), pack_elements_into_bits(indices, nbits))


def test_fast_pass_beats_coremltools_where_it_uses_scikit_learn(small_package, tmp_path):
    """Groups of 16 x 512 weights are under coremltools' 10,000 limit for its exact solver."""

    def error(algorithm):
        section = {"weights": {"mode": "palettize", "nbits": 4, "algorithm": algorithm,
                               "granularity": "per_grouped_channel", "group_size": 16}}
        _, program = _compress(small_package, tmp_path, section)
        dense = _lut_op(program, LINEAR).materialized_val_inference().astype(np.float64)
        original = small_package[1][LINEAR].astype(np.float16).astype(np.float64)
        return float(np.mean((dense - original) ** 2))

    assert error("kmeans") <= 0.97 * error("kmeans_coremltools")


def test_fast_pass_and_coremltools_pass_share_one_section(small_package, tmp_path):
    """Fast k-means for the linear, coremltools' uniform palettes for the conv, in one build."""
    section = {
        "weights": {"mode": "palettize", "nbits": 4},
        "overrides": [{"match": {"op_type": "conv"},
                       "weights": {"mode": "palettize", "nbits": 2, "algorithm": "uniform"}}],
    }
    report, program = _compress(small_package, tmp_path, section)
    assert _lut_op(program, LINEAR).lut.val.shape[-2] == 16
    conv_lut = _lut_op(program, CONV).lut.val.reshape(-1).astype(np.float64)
    assert conv_lut.size == 4 and np.allclose(np.diff(conv_lut), conv_lut[1] - conv_lut[0], rtol=1e-2)
    assert {_entry(report, CONV)["mode"], _entry(report, LINEAR)["mode"]} == {"palettize"}


def test_per_channel_scale_goes_through_coremltools_with_our_clustering(small_package, tmp_path):
    section = {"weights": {"mode": "palettize", "nbits": 4, "per_channel_scale": True}}
    _, program = _compress(small_package, tmp_path, section)
    ops = [op.op_type for op in iter_ops(program)]
    assert "constexpr_blockwise_shift_scale" in ops and "constexpr_lut_to_dense" in ops


def test_weight_file_writer_matches_coremltools_byte_for_byte(tmp_path):
    from coremltools.libmilstoragepython import _BlobStorageReader, _BlobStorageWriter
    from coremltools.proto import MIL_pb2

    from edgebuild_coreml.compress.blob_file import BlobReader, BlobWriter
    from edgebuild_coreml.compress.packing import pack_indices

    rng = np.random.default_rng(2)
    fp16 = rng.standard_normal(37).astype(np.float16)
    fp32 = rng.standard_normal(5).astype(np.float32)
    uint4 = rng.integers(0, 16, size=11).astype(np.uint8)
    uint3 = rng.integers(0, 8, size=7).astype(np.uint8)
    theirs_path, ours_path = tmp_path / "theirs.bin", tmp_path / "ours.bin"
    theirs = _BlobStorageWriter(str(theirs_path), truncate_file=True)
    their_offsets = [theirs.write_fp16_data(fp16.view(np.uint16)), theirs.write_float_data(fp32),
                     theirs.write_uint4_data(uint4), theirs.write_uint3_data(uint3)]
    del theirs
    dt = MIL_pb2.DataType
    with BlobWriter(ours_path) as ours:
        our_offsets = [ours.write(dt.FLOAT16, fp16), ours.write(dt.FLOAT32, fp32),
                       ours.write(dt.UINT4, pack_indices(uint4, 4), count=uint4.size),
                       ours.write(dt.UINT3, pack_indices(uint3, 3), count=uint3.size)]
    assert our_offsets == their_offsets
    assert ours_path.read_bytes() == theirs_path.read_bytes()
    # Our reader sees what theirs does, and a copied blob reads back the same through theirs.
    reader = BlobReader(theirs_path)
    np.testing.assert_array_equal(reader.array(dt.FLOAT16, their_offsets[0]), fp16)
    with BlobWriter(tmp_path / "copy.bin") as copy:
        copied = [copy.copy(reader, offset) for offset in their_offsets]
    np.testing.assert_array_equal(
        _BlobStorageReader(str(tmp_path / "copy.bin")).read_uint3_data(copied[3]), uint3)


@pytest.mark.parametrize("nbits", [1, 2, 3, 4, 6, 8])
def test_packing_by_table_look_up_equals_packing_the_looked_up_labels(nbits):
    from edgebuild_coreml.compress.packing import pack_indices, pack_looked_up

    rng = np.random.default_rng(nbits)
    table = rng.integers(0, 1 << nbits, size=1 << 16).astype(np.uint8)
    keys = rng.integers(0, 1 << 16, size=(1 << 18) * 2 + 13).astype(np.uint16)  # past a slice edge
    np.testing.assert_array_equal(pack_looked_up(table, keys, nbits), pack_indices(table[keys], nbits))
