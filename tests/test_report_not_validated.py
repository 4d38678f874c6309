"""A variant built with ``validate.reference: none`` is "built, not validated" and its page says why."""

from __future__ import annotations

import re

from edgebuild.report.schema import Report
from edgebuild.report.verdict import NOT_VALIDATED
from edgebuild.report.write import write_report
from edgebuild.verify.reference import NONE_WARNING

from test_report import variant_data

NOT_VALIDATED_RECORD = {"samples": 0, "reference": "none", "runtimes": {}, "failures": [],
                        "not_validated": "validate.reference: none", "warnings": [NONE_WARNING]}


def test_a_variant_without_a_reference_is_built_not_validated_with_the_warning_shown(tmp_path):
    data = variant_data("fp32", noise=1e-6, shrink=2)
    data["validation"] = dict(NOT_VALIDATED_RECORD)
    assert Report.model_validate(data).verdict == NOT_VALIDATED
    html = write_report(tmp_path, data)[1].read_text()
    assert '<span class="badge neutral">built, not validated</span>' in re.search(r"<h1>(.*?)</h1>", html).group(1)
    warnings = re.search(r'<section id="warnings">(.*?)</section>', html).group(1)
    assert "was not compared with its source model" in warnings
    assert "not validated: validate.reference: none" in html
    assert "validation passed" not in html


def test_the_warning_is_listed_once_when_the_validate_stage_reports_it_too(tmp_path):
    data = variant_data("fp32", noise=1e-6, shrink=2)
    data["validation"] = dict(NOT_VALIDATED_RECORD)
    data.setdefault("stages", []).append({"name": "validate", "key": "0" * 64, "status": "ran"})
    data["validate"] = {"warnings": [NONE_WARNING]}
    html = write_report(tmp_path, data)[1].read_text()
    assert html.count("was not compared with its source model") == 1
