"""Palettisation as a protobuf edit: same weights and ops as the MIL-program pass, a valid package."""

import numpy as np
import pytest

import coremltools as ct
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.compress.apply import compress_mlpackage
from edgebuild_coreml.compress.config import PalettizeWeights, validate_compression
from edgebuild_coreml.compress.fast_palettize import fast_palettize_program
from edgebuild_coreml.compress.program import iter_ops, load_program, weight_uses
from edgebuild_coreml.compress.selection import WeightSelection
from edgebuild_coreml.compress.serialize import save_program
from edgebuild_coreml.compress.spec_palettize import palettize_package

WEIGHTS = "Data/com.apple.CoreML/weights/weight.bin"


@pytest.fixture(scope="module")
def mixed_package(tmp_path_factory):
    """conv, linear, matmul with a transposed and a plain constant y, and a small bias."""
    rng = np.random.default_rng(7)
    conv_w = rng.standard_normal((32, 8, 3, 3)).astype(np.float32)
    lin_w = rng.standard_normal((64, 32)).astype(np.float32)
    mm_t = rng.laplace(size=(48, 64)).astype(np.float32)  # y transposed: output channels first
    mm_y = rng.standard_normal((48, 80)).astype(np.float32)  # y plain: output channels last
    bias = rng.standard_normal(64).astype(np.float32)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 8, 5, 5))], opset_version=ct.target.iOS18)
    def program(x):
        y = mb.conv(x=x, weight=conv_w, name="conv")
        y = mb.reduce_mean(x=y, axes=[2, 3], keep_dims=False)
        y = mb.linear(x=y, weight=lin_w, bias=bias, name="lin")
        y = mb.matmul(x=y, y=mm_t, transpose_y=True, name="mm_t")
        return mb.matmul(x=y, y=mm_y, name="mm_y")

    model = ct.convert(program, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS18,
                       compute_precision=ct.precision.FLOAT16, skip_model_load=True)
    path = tmp_path_factory.mktemp("spec") / "mixed.mlpackage"
    model.save(str(path))
    return path


def _lut_weights(path):
    program = load_program(ct.models.MLModel(str(path), skip_model_load=True))
    return {op.name: op for op in iter_ops(program) if op.op_type == "constexpr_lut_to_dense"}, program


def _weights(nbits, granularity="per_tensor", group_size=32):
    return PalettizeWeights(mode="palettize", nbits=nbits, granularity=granularity, group_size=group_size)


def _mil_pass(src, dst, weights):
    """The MIL-program pass the protobuf edit replaces, as the reference."""
    model = ct.models.MLModel(str(src), skip_model_load=True)
    program = load_program(model)
    fast_palettize_program(program, WeightSelection(weights), weight_threshold=255)
    save_program(program, model, dst)


@pytest.mark.parametrize("nbits,granularity,group_size", [(4, "per_tensor", 0), (2, "per_grouped_channel", 16)])
def test_spec_edit_matches_mil_pass(mixed_package, tmp_path, nbits, granularity, group_size):
    ours, reference = tmp_path / "ours.mlpackage", tmp_path / "ref.mlpackage"
    weights = _weights(nbits, granularity, group_size or 32)
    palettize_package(mixed_package, ours, weights, weight_threshold=255)
    _mil_pass(mixed_package, reference, weights)
    got, _ = _lut_weights(ours)
    want, _ = _lut_weights(reference)
    assert sorted(got) == sorted(want) and len(got) == 4
    for name, op in got.items():
        assert op.indices.dtype == want[name].indices.dtype and op.lut.val.shape == want[name].lut.val.shape
        np.testing.assert_array_equal(op.materialized_val_inference(), want[name].materialized_val_inference())


def test_spec_edit_is_a_valid_smaller_package(mixed_package, tmp_path):
    from edgebuild_coreml.interpreter import run_mlpackage

    dst = tmp_path / "out.mlpackage"
    before, after = palettize_package(mixed_package, dst, _weights(4), weight_threshold=255)
    spec = ct.utils.load_spec(str(dst))
    assert spec.WhichOneof("Type") == "mlProgram"
    ops, program = _lut_weights(dst)
    # The sizes reported from the protobuf are the ones the loaded program shows.
    assert after == weight_uses(program)
    assert before == weight_uses(load_program(ct.models.MLModel(str(mixed_package), skip_model_load=True)))
    assert (dst / WEIGHTS).stat().st_size < (mixed_package / WEIGHTS).stat().st_size / 2
    # The bias is copied unchanged; the linear weight decodes to exactly lut[indices].
    source = load_program(ct.models.MLModel(str(mixed_package), skip_model_load=True))
    bias = next(op for op in iter_ops(program) if op.op_type == "linear").bias.val
    np.testing.assert_array_equal(bias, next(op for op in iter_ops(source) if op.op_type == "linear").bias.val)
    lin = next(op for name, op in ops.items() if name.startswith("lin"))
    np.testing.assert_array_equal(
        lin.materialized_val_inference(),
        lin.lut.val.reshape(-1)[lin.indices.val.astype(np.intp)])
    x = np.random.default_rng(0).standard_normal((1, 8, 5, 5)).astype(np.float32)
    (output,) = run_mlpackage(dst, {"x": x}).values()
    assert np.asarray(output).shape == (1, 80) and np.isfinite(np.asarray(output)).all()


def test_compress_mlpackage_reports_from_the_edit(mixed_package, tmp_path):
    dst = tmp_path / "out.mlpackage"
    section = validate_compression({"weights": {"mode": "palettize", "nbits": 4}, "weight_threshold": 256},
                                   target="iOS18")
    report = compress_mlpackage(mixed_package, dst, section)
    modes = {w["name"].split("_")[0] + "." + w["name"].rsplit(".", 1)[1]: w["mode"] for w in report["weights"]}
    assert modes["conv.weight"] == modes["lin.weight"] == modes["mm.y"] == "palettize"
    assert modes["lin.bias"] == "none"
    assert report["bytes_after"] < report["bytes_before"] / 3
