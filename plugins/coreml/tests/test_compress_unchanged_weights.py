"""Compression tells the truth: a compression that changes no weight is an error; one that
leaves some targeted weights alone warns, naming them."""

from __future__ import annotations

from pathlib import Path

import coremltools as ct
import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb

from edgebuild.errors import BuildError


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """conv (32x16x3x3) whose weights take 16 distinct values, and a linear (64x512) of random ones."""
    rng = np.random.default_rng(0)
    conv_weight = rng.choice(np.linspace(-1, 1, 16), size=(32, 16, 3, 3)).astype(np.float32)
    linear_weight = rng.standard_normal((64, 512)).astype(np.float32)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 16, 6, 6))], opset_version=ct.target.iOS18)
    def prog(x):
        y = mb.reduce_mean(x=mb.conv(x=x, weight=conv_weight, name="stem"), axes=[2, 3], keep_dims=False)
        return mb.linear(x=mb.concat(values=[y] * 16, axis=1), weight=linear_weight, name="head")

    model = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS18,
                       compute_precision=ct.precision.FLOAT32, skip_model_load=True)
    path = tmp_path_factory.mktemp("model") / "small.mlpackage"
    model.save(str(path))
    return path


def compress(package: Path, tmp_path: Path, section: dict) -> dict:
    from edgebuild_coreml.compress.apply import compress_mlpackage
    from edgebuild_coreml.compress.config import validate_compression

    return compress_mlpackage(package, tmp_path / "out.mlpackage", validate_compression(section, target="iOS18"))


def test_unique_palettization_of_trained_weights_is_an_error_naming_them(package, tmp_path):
    section = {"weights": {"mode": "palettize", "algorithm": "unique"},
               "overrides": [{"match": {"op_type": "conv"}, "weights": None}]}  # only the random linear
    with pytest.raises(BuildError, match=r"compression changed no weight.*head\.weight") as info:
        compress(package, tmp_path, section)
    assert "256 distinct values" in (info.value.hint or "")


def test_weights_a_mode_leaves_alone_are_named_in_a_warning(package, tmp_path):
    report = compress(package, tmp_path, {"weights": {"mode": "palettize", "algorithm": "unique"}})
    by_name = {w["name"]: w for w in report["weights"]}
    assert by_name["stem.weight"]["mode"] == "palettize"  # 16 values: palettized
    assert by_name["head.weight"]["mode"] == "none"
    (warning,) = report["warnings"]
    assert "1 of 2 weight(s)" in warning and "head.weight" in warning and "stem.weight" not in warning


def test_a_compression_that_changes_every_weight_is_silent(package, tmp_path):
    report = compress(package, tmp_path, {"weights": {"mode": "linear", "dtype": "int8"}})
    modes = {w["name"]: w["mode"] for w in report["weights"]}
    assert modes["stem.weight"] == modes["head.weight"] == "linear" and "warnings" not in report


def test_weights_below_the_threshold_or_excluded_are_not_counted(package, tmp_path):
    section = {"weights": {"mode": "linear", "dtype": "int8"}, "weight_threshold": 5000}  # only the linear
    report = compress(package, tmp_path, section)
    assert "warnings" not in report and {w["name"]: w["mode"] for w in report["weights"]}["head.weight"] == "linear"
