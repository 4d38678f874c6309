"""The Core ML plugin as the core finds it: discovered through its entry point with its backend
and lowerings, and registered without importing coremltools (a stage that needs it does)."""

from __future__ import annotations

import json

from edgebuild_testplugin.cli_runner import edgebuild
from edgebuild_testplugin.imports import imported_by


def test_the_coreml_distribution_is_discovered_with_its_backend_and_lowerings():
    done = edgebuild("plugins", "--json", check=0)
    plugins = {p["name"]: p for p in json.loads(done.stdout)["plugins"]}
    assert "coreml" in plugins["coreml"]["registered"]["backends"]
    assert len(plugins["coreml"]["registered"]["lowerings"]) >= 120


def test_getting_the_backend_imports_no_coremltools_or_onnx():
    code = "from edgebuild.registry import get_registry; get_registry().get('backends', 'coreml')"
    assert imported_by(code, ("coremltools", "onnx", "onnxscript", "torch")) == []
