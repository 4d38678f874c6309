"""Fixtures shared by the bundle's tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def source_reference():
    """``reference(model)``: the runner the core validates a build of the ONNX ``model`` against
    (for these models' com.example::RMSNorm, onnx's evaluator with the registered custom ops'
    references)."""
    from edgebuild.recipe.validation import ValidateSection
    from edgebuild.registry import get_registry
    from edgebuild.verify.reference import choose_reference

    def reference(model: Path):
        return choose_reference(model, get_registry(), fmt="onnx", inputs={}, options=None,
                                base_dir=model.parent, section=ValidateSection()).runner

    return reference
