"""The Core ML plugin as the core finds it: discovered through its entry point with its backend
and lowerings, and registered without importing coremltools (a stage that needs it does)."""

from __future__ import annotations

import json
import subprocess
import sys

from edgebuild_testplugin.cli_runner import edgebuild


def test_the_coreml_distribution_is_discovered_with_its_backend_and_lowerings():
    done = edgebuild("plugins", "--json", check=0)
    plugins = {p["name"]: p for p in json.loads(done.stdout)["plugins"]}
    assert "coreml" in plugins["coreml"]["registered"]["backends"]
    assert len(plugins["coreml"]["registered"]["lowerings"]) >= 120


def test_getting_the_backend_imports_no_coremltools_or_onnx():
    code = ("import sys; from edgebuild.registry import get_registry; r = get_registry(); "
            "r.get('backends', 'coreml'); "
            "print(sorted(m for m in ('coremltools', 'onnx', 'onnxscript', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
