"""NaN and inf in validation: inputs that make both sides NaN, outputs NaN or inf on one side or both.

A comparison that compared nothing (all-NaN inputs used to pass with cosine 1.0) is a failure; NaN in
the reference is a failure even matched by the candidate; the same infinity on both sides at one
position (a masked logit) agrees, and the finite rest is compared. Each failure names the output, the
side that holds the values and how many there are; report.json never holds a NaN, and a variant
with one fails.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgebuild.dag.validate import validate
from edgebuild.errors import UsageError
from edgebuild.recipe.validation import ValidateSection
from edgebuild_testplugin.cli_runner import assert_usage_error
from edgebuild_testplugin.models import save_model
from edgebuild_testplugin.recipes import BASE_RECIPE

MASK = np.array([0.0, -np.inf, 0.0, -np.inf], dtype=np.float32)  # an additive attention mask


def plus_constant(path, constant: np.ndarray, op: str = "Add"):
    """y = x <op> c, x: float32 [2, 4] (c: [4])."""
    return save_model(path, [helper.make_node(op, ["x", "c"], ["y"])],
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                      [numpy_helper.from_array(constant.astype(np.float32), "c")])


def run_both(tmp_path, reference_fn, candidate_fn, **section) -> dict:
    """The validation record of ``candidate_fn`` against ``reference_fn`` (each: x -> y) on random x."""
    model = plus_constant(tmp_path / "m.onnx", np.zeros(4))
    spec = ValidateSection.model_validate({"samples": 3, **section})
    return validate(spec, model, {}, lambda feed: {"y": candidate_fn(feed["x"])}, tmp_path,
                    reference=lambda feed: {"y": reference_fn(feed["x"])}, parallel=False)


def only(record: dict) -> dict:
    return {failure["metric"]: failure["message"] for failure in record["failures"]}


def with_nan(x):
    out = x.copy()
    out[0, 1:3] = np.nan
    return out


def with_inf(sign: float):
    def make(x):
        out = x.copy()
        out[1, 0] = sign * np.inf
        return out
    return make


# (id, reference, candidate, {failed metric: phrase}); empty: passes, thresholds held on the finite rest
CASES = [
    ("candidate-nan", lambda x: x, with_nan, {"nonfinite": "candidate has NaN/inf (2 values in the worst sample)"}),
    ("candidate-inf", lambda x: x, with_inf(1), {"nonfinite": "candidate has NaN/inf (1 values in the worst sample)"}),
    ("reference-nan-candidate-finite", with_nan, lambda x: x,
     {"reference_nonfinite": "reference has NaN/inf (2 values in the worst sample)"}),
    ("nan-on-both-sides", with_nan, with_nan, {"reference_nonfinite": "reference has NaN/inf (2 values"}),
    ("all-nan-on-both-sides", lambda x: x * np.nan, lambda x: x * np.nan,
     {"reference_nonfinite": "8 values", "compared": "nothing was compared"}),
    ("all-inf-on-both-sides", lambda x: x + np.inf, lambda x: x + np.inf, {"compared": "nothing was compared"}),
    ("reference-inf-candidate-finite", with_inf(1), lambda x: x, {"reference_nonfinite": "reference has NaN/inf (1 values"}),
    ("inf-of-the-other-sign", with_inf(1), with_inf(-1),
     {"nonfinite": "candidate has NaN/inf (1 values", "reference_nonfinite": "reference has NaN/inf (1 values"}),
    ("same-inf-on-both-sides", with_inf(-1), with_inf(-1), {}),
]


@pytest.mark.parametrize("reference, candidate, failed", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_nonfinite_outputs(tmp_path, reference, candidate, failed):
    record = run_both(tmp_path, reference, candidate, thresholds={"cosine_min": 0.999, "max_abs_max": 1e-6})
    failures = only(record)
    assert set(failures) == set(failed), failures
    for metric, phrase in failed.items():
        assert phrase in failures[metric] and "output 'y'" in failures[metric]
    if not failed:  # the finite rest was compared and held to the limits
        metrics = record["runtimes"]["interpreter"]["metrics"]["y"]
        assert metrics["compared"]["min"] == 7 and metrics["cosine"]["min"] > 0.999


def test_a_matched_mask_still_fails_when_the_finite_rest_differs(tmp_path):
    record = run_both(tmp_path, lambda x: x + MASK, lambda x: x + 0.1 + MASK, thresholds={"max_abs_max": 0.01})
    assert set(only(record)) == {"max_abs"}  # the -inf agreed; the finite part was compared and failed
    assert record["failures"][0]["value"] == pytest.approx(0.1, rel=1e-5)


def test_nothing_compared_is_never_a_cosine_of_one(tmp_path):
    record = run_both(tmp_path, lambda x: x * np.nan, lambda x: x * np.nan)  # no thresholds at all: still fails
    cosine = record["runtimes"]["interpreter"]["metrics"]["y"]["cosine"]
    assert np.isnan(cosine["min"]) and record["failures"]


@pytest.mark.parametrize("values", [np.full((2, 4), np.nan), np.array([[0.5, np.nan, 0.1, 0.2]] * 2)],
                         ids=["all-nan", "one-nan"])
def test_nan_validation_inputs_from_a_file_are_refused(tmp_path, values):
    np.save(tmp_path / "x.npy", values.astype(np.float32))
    with pytest.raises(UsageError, match=r"validate.inputs.x.file: validation inputs contain NaN \(\d+ of 8 values"):
        run_both(tmp_path, lambda x: x, lambda x: x, inputs={"x": {"file": "x.npy"}})


def test_infinite_validation_inputs_are_kept(tmp_path):
    np.save(tmp_path / "x.npy", np.array([[0.5, -np.inf, 0.1, 0.2]] * 2, dtype=np.float32))
    record = run_both(tmp_path, lambda x: x, lambda x: x, inputs={"x": {"file": "x.npy"}})
    assert record["failures"] == []


@pytest.mark.parametrize("value, column", [(".nan", 32), ("[0.5, .NaN, 0.1, 0.2]", 32), ("'nan'", 32)])
def test_a_nan_value_in_the_recipe_is_a_recipe_error_with_its_line(tmp_path, cli, value, column):
    plus_constant(tmp_path / "m.onnx", np.zeros(4))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(BASE_RECIPE + f"validate: {{inputs: {{x: {{value: {value}}}}}}}\n")
    code, _, err = cli("validate", recipe)
    assert_usage_error(code, err, f"recipe.yaml:8:{column}", "validation inputs contain NaN")


def test_verify_of_an_artifact_that_computes_nan(tmp_path, cli):
    """The reference finite, the artifact NaN at random inputs (sqrt of x - 2): exit 3 naming both."""
    import shutil

    reference = plus_constant(tmp_path / "m.onnx", np.zeros(4))
    (tmp_path / "art").mkdir()
    artifact_model = save_model(tmp_path / "nan.onnx", [helper.make_node("Sub", ["x", "c"], ["s"]),
                                                        helper.make_node("Sqrt", ["s"], ["y"])],
                                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                                [numpy_helper.from_array(np.full(4, 2.0, np.float32), "c")])
    shutil.copy(artifact_model, tmp_path / "art" / "model.onnx")
    code, out, err = cli("verify", tmp_path / "art", "--reference", reference, "--json")
    assert code == 3, err
    assert "output 'y': candidate has NaN/inf (8 values in the worst sample)" in err
    record = json.loads(out, parse_constant=_no_constants)  # strict JSON: no NaN/Infinity literals
    assert record["failures"][0]["runtime"] == "testcopy"


def test_verify_of_a_source_that_computes_nan_everywhere(tmp_path, cli):
    """Both sides NaN everywhere (the artifact is the source): it used to pass with cosine 1.0."""
    import shutil

    source = save_model(tmp_path / "nan.onnx", [helper.make_node("Sub", ["x", "c"], ["s"]),
                                                helper.make_node("Sqrt", ["s"], ["y"])],
                        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                        [numpy_helper.from_array(np.full(4, 2.0, np.float32), "c")])
    (tmp_path / "art").mkdir()
    shutil.copy(source, tmp_path / "art" / "model.onnx")
    code, out, err = cli("verify", tmp_path / "art", "--reference", source, "--json")
    assert code == 3, err
    assert "output 'y': reference has NaN/inf (8 values in the worst sample)" in err
    assert "nothing was compared" in err
    metrics = json.loads(out, parse_constant=_no_constants)["runtimes"]["testcopy"]["metrics"]["y"]
    assert metrics["cosine"]["min"] == "nan"  # written as a string, and never as a pass


def test_report_json_of_a_nan_variant_is_strict_json_and_failed(tmp_path):
    from edgebuild.report.write import runtime_record, write_report
    from edgebuild.verify.metrics import aggregate, compare
    from edgebuild.verify.thresholds import check

    y = np.full((2, 4), np.nan)
    aggregated = aggregate([compare({"y": y}, {"y": y})])
    failures = check(aggregated, None)
    record = runtime_record(aggregated, failures)
    json_path, _ = write_report(tmp_path, {"status": "failed" if failures else "built",
                                           "validation": {"runtimes": {"interpreter": record}}})
    written = json.loads(json_path.read_text(), parse_constant=_no_constants)
    assert written["status"] == "failed"
    assert {f["metric"] for f in written["validation"]["runtimes"]["interpreter"]["failures"]} == {
        "reference_nonfinite", "compared"}


def _no_constants(name):
    raise AssertionError(f"report holds the JSON-invalid literal {name}")
