"""Comparing the predicted plan with Core ML's own (the comparison logic runs anywhere)."""

from __future__ import annotations

import platform

import pytest

from edgebuild_coreml.measured_plan import MeasuredOp, agreement, compare_with_core_ml, unit_of

PREDICTED = [
    {"name": "conv1", "op": "conv", "unit": "ane", "fused_into": None},
    {"name": "relu1", "op": "relu", "unit": "ane", "fused_into": "conv1"},
    {"name": "lstm", "op": "lstm", "unit": "cpu", "fused_into": None},
    {"name": "soft", "op": "softmax", "unit": "gpu", "fused_into": None},
]


def test_agreement_counts_matches_and_weights_by_cost():
    measured = [MeasuredOp("conv1", "conv", "ane", 0.6), MeasuredOp("relu1", "relu", "ane", 0.1),
                MeasuredOp("lstm", "lstm", "cpu", 0.2), MeasuredOp("soft", "softmax", "ane", 0.1),
                MeasuredOp("unknown", "add", "cpu", 0.0)]
    result = agreement(PREDICTED, measured)
    assert result["compared"] == 4
    assert result["agreement"] == pytest.approx(0.75)
    assert result["cost_weighted_agreement"] == pytest.approx(0.9)
    assert [d["name"] for d in result["disagreements"]] == ["soft"]
    assert result["disagreements"][0]["predicted"] == "gpu" and result["disagreements"][0]["measured"] == "ane"


def test_fused_ops_are_judged_through_their_host():
    measured = [MeasuredOp("relu1", "relu", "cpu", 1.0)]
    assert agreement(PREDICTED, measured)["disagreements"][0]["predicted"] == "ane"


def test_devices_map_by_class_name():
    class MLNeuralEngineComputeDevice: ...
    class MLGPUComputeDevice: ...

    assert unit_of(MLNeuralEngineComputeDevice()) == "ane" and unit_of(MLGPUComputeDevice()) == "gpu"


@pytest.mark.skipif(platform.system() == "Darwin", reason="off macOS only")
def test_off_macos_the_measurement_is_skipped_with_a_reason(tmp_path):
    result = compare_with_core_ml(tmp_path / "model.mlpackage", {"ops": PREDICTED})
    assert "only be read on macOS" in result["skipped"]
