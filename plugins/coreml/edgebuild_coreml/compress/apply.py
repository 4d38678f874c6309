"""Apply a validated compression section to an .mlpackage.

Activation quantisation runs first, then the weight passes (:mod:`.passes`: prune, linear,
palettise) on one :class:`~.working.WorkingModel`. When scalar k-means palettisation is the
whole section, :mod:`.spec_palettize` edits the package's protobuf and weight file instead
and no MIL program is built at all; when every mode is linear on an iOS18 program,
:mod:`.spec_linear` does the same, streaming one tensor at a time.

The section comes validated, and checked against the deployment target, from the recipe's
load (or from ``config.validate_compression``); nothing here parses or checks it again.
"""

from __future__ import annotations

from pathlib import Path

import coremltools as ct
import numpy as np

from .activations import quantize_activations
from .config import CompressionSection
from .fast_palettize import handles
from .noop import check_something_changed
from .passes import plan_weight_passes
from .program import weight_uses
from .report import section_in_words, weight_report
from .spec_linear import handles_section as linear_only, quantize_package
from .spec_palettize import NotEditable, palettize_package
from .working import WorkingModel


def compress_mlpackage(
    src: Path,
    dst: Path,
    section: CompressionSection,
    *,
    calibration: list[dict[str, np.ndarray]] | None = None,
) -> dict:
    """Compress ``src`` into ``dst`` (written atomically) and report every weight's sizes."""
    src, dst = Path(src), Path(dst)
    if _is_plain_kmeans_palettize(section):
        try:
            before, after = palettize_package(src, dst, section.weights,
                                              weight_threshold=max(section.weight_threshold - 1, 0))  # as the passes
            return _checked_report(section, before, after)
        except NotEditable:
            pass  # an unusual package: the MIL program path below handles it
    elif linear_only(section):
        try:  # one tensor at a time, never the whole model in memory
            before, after = quantize_package(src, dst, section, weight_threshold=max(section.weight_threshold - 1, 0))
            return _checked_report(section, before, after)
        except NotEditable:
            pass  # before iOS18, or a weight coremltools' pass must decide

    working = WorkingModel(ct.models.MLModel(str(src), skip_model_load=True))
    before = weight_uses(working.program)
    if section.activations is not None:
        working.model, _ = quantize_activations(working.model, calibration, source=src)
    for weight_pass in plan_weight_passes(section, working.program):
        weight_pass.apply(working)
    after = weight_uses(working.program)
    working.save(dst)
    return _checked_report(section, before, after)


def _checked_report(section: CompressionSection, before: dict, after: dict) -> dict:
    """The report, with a warning naming targeted weights left as they were (none changed: an error)."""
    report = {**weight_report(before, after), "applied": section_in_words(section)}
    warnings = check_something_changed(section, before, after)
    if warnings:
        report["warnings"] = warnings
    return report


def _is_plain_kmeans_palettize(section: CompressionSection) -> bool:
    """Only our scalar k-means palettisation, one config for every weight, nothing combined."""
    return (
        handles(section.weights)
        and not section.overrides
        and section.activations is None
        and section.auto is None
    )
