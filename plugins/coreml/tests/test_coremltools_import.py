"""coremltools imported lean (edgebuild_coreml.coremltools_import): each case in a fresh process,
since what a process imported first decides how coremltools is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("coremltools")
pytest.importorskip("torch")


def run_fresh(code: str, **env) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


SEEN = """
import json, sys
from coremltools import _deps
seen = {"has_torch": _deps._HAS_TORCH,
        "imported": sorted(m for m in ("torch", "sklearn", "transformers", "tensorflow", "xgboost", "scipy") if m in sys.modules)}
"""


def test_coremltools_is_imported_without_torch_and_torch_imports_afterwards():
    seen = run_fresh("import edgebuild_coreml, coremltools\n" + SEEN + """
import torch
from transformers.utils import is_torch_available
seen["torch_after"] = torch.ones(2).sum().item()
seen["transformers_has_torch"] = is_torch_available()
print(json.dumps(seen))
""")
    assert seen == {"has_torch": False, "imported": [], "torch_after": 2.0, "transformers_has_torch": True}


def test_a_submodule_first_is_lean_too():
    seen = run_fresh("import edgebuild_coreml\nfrom coremltools.converters.mil import Builder\n" + SEEN
                     + "print(json.dumps(seen))")
    assert seen == {"has_torch": False, "imported": []}


def test_torch_imported_first_gets_the_whole_coremltools():
    seen = run_fresh("import torch, edgebuild_coreml, coremltools\n" + SEEN + "print(json.dumps(seen))")
    assert seen["has_torch"] is True


def test_the_environment_variable_turns_it_off():
    seen = run_fresh("import edgebuild_coreml, coremltools\n" + SEEN + "print(json.dumps(seen))",
                     EDGEBUILD_COREMLTOOLS_FULL_IMPORT="1")
    assert seen["has_torch"] is True and "torch" in seen["imported"]
