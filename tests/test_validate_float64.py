"""validate.reference: float64 and the float64 check on failures, on a graph whose fp32 reference is noisy.

The graph computes ``(x + 1000) - 1000``: exactly ``x`` in float64, but in float32 every ``x`` is
rounded to the grid of 2**-13 around 1000, so onnxruntime's fp32 answer is far (relatively) from
the exact one while an artifact that computes ``x`` directly is exact. Against onnxruntime such an
artifact fails a tight cosine; against float64 it is perfect.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from pydantic import ValidationError

from edgebuild.dag.validate import validate
from edgebuild.errors import BuildError
from edgebuild.report.html import render_report
from edgebuild.report.schema import Report
from edgebuild.recipe.validation import ValidateSection
from edgebuild.verify.metrics import FLOAT32_EPS, NOISE_FLOOR_EPS, compare_with_float64

SIZE = 256


@pytest.fixture
def cancelling_model(tmp_path):
    big = numpy_helper.from_array(np.array(1000.0, np.float32), "big")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "big"], ["shifted"]), helper.make_node("Sub", ["shifted", "big"], ["y"])],
        "cancelling", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [SIZE])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [SIZE])], [big],
    )
    path = tmp_path / "cancelling.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def exact(inputs):
    return {"y": inputs["x"]}


def noisy(inputs):
    """An artifact much further from the exact answer than onnxruntime's rounding."""
    return {"y": inputs["x"] + np.float32(3e-4) * np.sign(inputs["x"])}


def section(**fields) -> ValidateSection:
    return ValidateSection.model_validate(
        {"samples": 3, "inputs": {"x": {"random": {"low": -0.001, "high": 0.001, "seed": 4}}}, **fields})


def run(model, candidate, **fields) -> dict:
    return validate(section(**fields), model, {}, candidate, model.parent, parallel=False)


def test_a_noisy_reference_fails_a_tight_cosine_and_the_float64_check_says_so(cancelling_model):
    record = run(cancelling_model, exact, thresholds={"cosine_min": 0.99999})
    [failure] = record["failures"]
    assert failure["metric"] == "cosine"
    assert "the fp32 reference is the noisy side" in failure["message"]
    check = record["runtimes"]["interpreter"]["float64_check"]
    distances = check["outputs"]["y"]
    assert distances["candidate"]["max_abs"] < 1e-12  # the artifact computed x exactly
    assert distances["fp32_reference"]["max_abs"] > 1e-5  # onnxruntime rounded x near 1000
    assert distances["noise_ratio"] < 1e-6
    assert 0 <= check["sample"] < 3


def test_the_float64_check_blames_a_noisy_artifact(cancelling_model):
    record = run(cancelling_model, noisy, thresholds={"cosine_min": 0.99999})
    [failure] = record["failures"]
    assert "further from the exact answer than onnxruntime" in failure["message"]
    assert record["runtimes"]["interpreter"]["float64_check"]["outputs"]["y"]["noise_ratio"] > 2.0


def test_no_float64_check_when_everything_passes(cancelling_model):
    record = run(cancelling_model, exact, thresholds={"cosine_min": 0.9})
    assert not record["failures"] and "float64_check" not in record["runtimes"]["interpreter"]


def test_float64_reference_measures_against_the_exact_answer(cancelling_model):
    record = run(cancelling_model, exact, reference="float64",
                 thresholds={"cosine_min": 0.9999999, "noise_ratio_max": 2.0})
    assert not record["failures"]
    assert record["reference"].startswith("float64 (onnxruntime")
    metrics = record["runtimes"]["interpreter"]["metrics"]["y"]
    assert metrics["cosine"]["min"] > 0.9999999
    assert metrics["fp32_reference_cosine"]["min"] < 0.9999  # onnxruntime fp32 is the far one
    assert metrics["fp32_reference_max_abs"]["max"] > 1e-5
    assert metrics["noise_ratio"]["max"] < 1e-6  # float64 rounds too, at 1e-13 near 1000


def test_noise_ratio_max_fails_an_artifact_further_than_onnxruntime(cancelling_model):
    record = run(cancelling_model, noisy, reference="float64", thresholds={"noise_ratio_max": 2.0})
    [failure] = record["failures"]
    assert failure["metric"] == "noise_ratio" and failure["value"] > 2.0


def test_the_report_shows_both_distances(cancelling_model):
    record = run(cancelling_model, exact, thresholds={"cosine_min": 0.99999})
    page = render_report(Report.model_validate({"recipe": "r", "variant": "fp32", "status": "failed",
                                                "validation": record}))
    assert "onnxruntime fp32 max abs" in page and "float64" in page
    record = run(cancelling_model, exact, reference="float64", thresholds={"noise_ratio_max": 2.0})
    page = render_report(Report.model_validate({"recipe": "r", "variant": "fp32", "status": "built",
                                                "validation": record}))
    assert "noise ratio" in page and "onnxruntime fp32 vs float64" in page


def test_noise_ratio_max_needs_the_float64_reference():
    with pytest.raises(ValidationError, match="validate.reference: float64"):
        section(thresholds={"noise_ratio_max": 2.0})
    with pytest.raises(ValidationError, match="validate.reference: float64"):
        section(per_output={"y": {"thresholds": {"noise_ratio_max": 2.0}}})
    with pytest.raises(ValidationError):
        section(reference="float16")


def test_float64_reference_is_refused_for_a_non_onnx_reference(cancelling_model):
    with pytest.raises(BuildError, match="evaluates an ONNX source"):
        validate(section(reference="float64"), cancelling_model, {}, exact, cancelling_model.parent,
                 reference=exact, reference_name="pytorch (eager)")


def test_noise_ratio_floors_the_reference_at_a_few_float32_epsilons():
    truth = {"y": np.array([1.0, -2.0, 0.5]), "ids": np.array([1, 2, 3])}
    reference = {"y": truth["y"].astype(np.float32), "ids": truth["ids"]}
    floor = NOISE_FLOOR_EPS * FLOAT32_EPS * 2.0  # the output's largest magnitude is 2
    candidate = {"y": (truth["y"] + [0.0, 4 * floor, 0.0]).astype(np.float32), "ids": truth["ids"]}
    metrics = compare_with_float64(truth, reference, candidate)
    assert metrics["y"]["fp32_reference_max_abs"] == 0.0
    assert metrics["y"]["noise_ratio"] == pytest.approx(4.0, rel=1e-3)
    assert "noise_ratio" not in metrics["ids"]  # integer outputs compare exactly, no ratio


def test_a_backend_merging_runtimes_keeps_the_float64_reference_name(cancelling_model):
    from edgebuild.dag.validate import merge_runtime

    record = {"samples": 0, "reference": "onnxruntime", "runtimes": {}, "failures": []}
    merge_runtime(record, run(cancelling_model, exact, reference="float64"))
    assert record["reference"].startswith("float64") and "interpreter" in record["runtimes"]
