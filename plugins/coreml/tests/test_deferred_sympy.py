"""coremltools imported lean imports sympy only once something symbolic is asked for
(edgebuild_coreml.deferred_sympy): packages read back and run alike with and without it, sympy
comes in when a program has symbols, and everyone else gets sympy itself. Each case in a fresh
process: what a process imported first decides how coremltools is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("coremltools")

HERE = Path(__file__).parent
PROGRAMS = HERE / "deferred_sympy_programs.py"
FULL = {"EDGEBUILD_COREMLTOOLS_FULL_IMPORT": "1"}


def _python(args: list[str], **env) -> str:
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=HERE,
                          env={**os.environ, **env}, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout


def run_fresh(code: str, **env) -> dict:
    return json.loads(_python(["-c", code], **env).strip().splitlines()[-1])


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    folder = tmp_path_factory.mktemp("packages")
    _python([str(PROGRAMS), "make", str(folder)])
    return folder


def _read(packages, command: str = "read", **env) -> dict:
    return json.loads(_python([str(PROGRAMS), command, str(packages)], **env).strip().splitlines()[-1])


@pytest.fixture(scope="module")
def lean(packages):
    return _read(packages)


def _same_programs(found: dict, expected: dict) -> None:
    assert sorted(found) == sorted(expected) == ["fixed", "flexible", "palettized"]
    for name in found:
        assert found[name]["ops"] == expected[name]["ops"], name
        assert sorted(found[name]["outputs"]) == sorted(expected[name]["outputs"]), name
        for output, values in found[name]["outputs"].items():
            np.testing.assert_allclose(values, expected[name]["outputs"][output], rtol=1e-6, atol=1e-7)


def test_every_package_reads_back_as_with_sympy_imported_from_the_start(packages, lean):
    with_sympy = _read(packages, "read-after-sympy")
    _same_programs(lean, with_sympy)
    assert all(found["sympy"] for found in with_sympy.values())


@pytest.mark.slow
def test_every_package_reads_back_as_with_the_whole_coremltools(packages, lean):
    _same_programs(lean, _read(packages, **FULL))


def test_sympy_is_imported_only_for_a_program_with_symbols(lean):
    # read in the order of INPUTS: fixed shapes, palettized weights, then a range dimension
    assert not lean["fixed"]["sympy"] and not lean["palettized"]["sympy"]
    assert lean["flexible"]["sympy"]


def test_coremltools_symbols_are_sympy_symbols_made_on_demand():
    seen = run_fresh("""
import json, pickle, sys
import edgebuild_coreml, coremltools
from coremltools.converters.mil.mil import Symbol, get_new_symbol
from coremltools.converters.mil.mil.types import symbolic as types
before = {"sympy": "sympy" in sys.modules, "symbolic": [types.is_symbolic(v) for v in (1, 2.5, "s")]}
symbol = get_new_symbol()
import sympy
print(json.dumps({**before, "sympy_after": "sympy" in sys.modules, "is_sympy": isinstance(symbol, sympy.Symbol),
                  "is_coremltools": isinstance(symbol, Symbol), "symbolic": before["symbolic"],
                  "symbol_symbolic": types.is_symbolic(symbol), "expression_symbolic": types.is_symbolic(symbol + 1),
                  "pickles": pickle.loads(pickle.dumps(symbol)) == symbol}))
""")
    assert seen == {"sympy": False, "symbolic": [False, False, False], "sympy_after": True, "is_sympy": True,
                    "is_coremltools": True, "symbol_symbolic": True, "expression_symbolic": True, "pickles": True}


@pytest.mark.parametrize("first", ["from sympy import Basic, Symbol", "import sympy; Basic, Symbol = sympy.Basic, sympy.Symbol"])
def test_everyone_else_gets_sympy_itself(first):
    seen = run_fresh(f"""
import json, sys
import edgebuild_coreml, coremltools
from coremltools.converters.mil.mil.types import symbolic as types
{first}
print(json.dumps({{"module": Basic.__module__, "real": sys.modules["sympy"].Basic is Basic,
                  "coremltools_sees_it": types.is_symbolic(Symbol("a") * 2)}}))
""")
    assert seen == {"module": "sympy.core.basic", "real": True, "coremltools_sees_it": True}


def test_torch_imported_afterwards_has_sympy():
    pytest.importorskip("torch")
    seen = run_fresh("""
import json
import edgebuild_coreml, coremltools
import torch
from torch.utils._sympy.functions import FloorDiv
import sympy
print(json.dumps({"sum": torch.ones(3).sum().item(), "floordiv": str(FloorDiv(sympy.Symbol("n"), 2))}))
""")
    assert seen["sum"] == 3.0 and "n" in seen["floordiv"]


@pytest.mark.slow
def test_the_environment_variable_imports_sympy_with_coremltools():
    seen = run_fresh("import json, sys, edgebuild_coreml, coremltools\nprint(json.dumps('sympy' in sys.modules))",
                     **FULL)
    assert seen is True
