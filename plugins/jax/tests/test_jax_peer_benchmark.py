"""benchmarks/stablehlo.py: what it measures is judged from fake measurements here (the table, the
ratios, the recipe it builds with, the constraints it installs the peer with); installing and
running the peer is the slow test."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "stablehlo.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("stablehlo_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def converted(seconds, work, cosine=0.999, run_error=None):
    return {"converts": True, "error": None, "seconds": seconds, "work_s": work, "cosine": cosine,
            "run_error": run_error}


def failed(error):
    return {"converts": False, "error": error, "wall_s": 1.0}


def row(bench, name, ours, theirs):
    found = {"model": name, "edgebuild": ours, "peer": theirs}
    found["ratio"], found["work_ratio"] = bench.ratio(found, "seconds"), bench.ratio(found, "work_s")
    return found


@pytest.mark.parametrize("ours_ok", [True, False])
@pytest.mark.parametrize("theirs_ok", [True, False])
def test_a_ratio_only_when_both_convert(bench, ours_ok, theirs_ok):
    ours = converted(6.0, 3.0) if ours_ok else failed("boom")
    theirs = converted(2.0, 0.5) if theirs_ok else failed("boom")
    found = row(bench, "m", ours, theirs)
    if ours_ok and theirs_ok:
        assert found["ratio"] == pytest.approx(3.0) and found["work_ratio"] == pytest.approx(6.0)
    else:
        assert found["ratio"] is None and found["work_ratio"] is None


def test_the_table_shows_each_side_and_the_ratios(bench):
    rows = [row(bench, "cnn", converted(4.0, 2.0, 0.99987), converted(2.0, 1.0, 0.5)),
            row(bench, "sort", converted(3.0, 1.0), failed("NotImplementedError: stablehlo.sort comparator")),
            row(bench, "gather", failed("ConversionError: gather: batching dims"), converted(1.0, 0.4)),
            row(bench, "while", converted(3.0, 1.0, None, "KeyError: 'x'"), converted(1.0, 0.5))]
    lines = bench.table(rows).splitlines()
    assert lines[0].split() == ["model", "edgebuild", "s", "work", "s", "cosine", "peer", "s", "work", "s",
                                "cosine", "ratio", "work", "ratio"]
    assert set(lines[1]) == {"-"} and len(lines) == 2 + len(rows)
    cnn, sort, gather, loop = lines[2:]
    assert cnn.split() == ["cnn", "yes", "4.00", "2.00", "0.9998700", "yes", "2.00", "1.00", "0.5000000",
                           "2.00", "2.00"]
    assert "no: NotImplementedError: stablehlo.sort" in sort and sort.split()[-2:] == ["-", "-"]
    assert gather.split()[1] == "no:" and gather.split()[-2:] == ["-", "-"]
    assert "run: KeyError" in loop and loop.split()[-2:] == ["3.00", "2.00"]


def test_columns_line_up(bench):
    rows = [row(bench, name, converted(s, s / 2), converted(1.0, 0.25))
            for name, s in (("a", 1.0), ("a_much_longer_name", 123.456))]
    lines = bench.table(rows).splitlines()
    starts = [line.index("yes") for line in lines[2:]]
    assert starts[0] == starts[1] == lines[0].index("edgebuild")


def test_the_rows_are_json(bench):
    rows = [row(bench, "cnn", converted(4.0, 2.0), failed("x"))]
    assert json.loads(json.dumps({"rows": rows}))["rows"][0]["ratio"] is None


@pytest.mark.parametrize("name", ["cnn", "gru_scan", "conv_transpose"])
def test_the_recipe_builds_the_export_at_fp16_with_no_threshold_to_fail(bench, name):
    recipe = yaml.safe_load(bench.recipe_text(name))
    assert recipe["edgebuild"] == 1 and recipe["name"] == name
    assert recipe["source"] == {"model": f"{name}.jaxexport"}
    assert recipe["target"] == {"backend": "coreml", "precision": "float16"}
    assert recipe["validate"]["thresholds"]["cosine_min"] <= -1.0
    assert recipe["outputs"]["dir"] == f"{name}.edgebuild"
    assert recipe["validate"]["inputs"] == {}


@pytest.mark.parametrize("integers", [{"ids": (0, 49)}, {"input_0": (0, 9), "positions": (2, 7)}])
def test_integer_inputs_are_drawn_from_their_range(bench, integers):
    drawn = yaml.safe_load(bench.recipe_text("m", integers))["validate"]["inputs"]
    assert set(drawn) == set(integers)
    for name, (low, high) in integers.items():
        assert drawn[name]["random"]["low"] == low and drawn[name]["random"]["high"] == high


def test_the_recipe_is_valid(bench):
    from edgebuild.recipe.validation import ValidateSection

    for integers in ({}, {"ids": (0, 49)}):
        recipe = yaml.safe_load(bench.recipe_text("m", integers))
        ValidateSection.model_validate(recipe["validate"])  # raises on a bad section


@pytest.mark.parametrize("pin", ["jax==0.10.2", "jaxlib==0.10.2", "JAX==1", "jaxlib >= 0.4", "Jaxlib==0.10.2  # cpu"])
def test_the_projects_jax_pins_are_left_to_the_peer(bench, pin):
    kept = bench.peer_constraints(f"numpy==2.4.6\n{pin}\ncoremltools==9.0\n").splitlines()
    assert kept == ["numpy==2.4.6", "coremltools==9.0"]


@pytest.mark.parametrize("pin", ["jaxtyping==0.2", "jax-metal==0.1", "flax==0.12.8", "ml_dtypes==0.6.0",
                                 "# jax==0.10.2 below"])
def test_other_pins_are_kept(bench, pin):
    assert bench.peer_constraints(f"{pin}\n").splitlines() == [pin]


def test_the_newest_constraints_lose_only_the_jax_pins(bench):
    newest = (ROOT / "constraints" / "newest.txt").read_text().splitlines()
    kept = bench.peer_constraints("\n".join(newest)).splitlines()
    dropped = [line for line in newest if line not in kept]
    assert dropped and all(line.lower().startswith(("jax==", "jaxlib==")) for line in dropped)


@pytest.mark.parametrize("text, want", [
    ("Traceback (most recent call last):\n  File x\nValueError: bad op\n\n", "ValueError: bad op"),
    ("error: stablehlo.foo is not supported\nhint: write it another way\n", "error: stablehlo.foo is not supported"),
    ("ValueError: Var c should be output of block\n  %1 = add(x, y)\n} -> (%1)\n",
     "ValueError: Var c should be output of block"),
    ("RuntimeError: first\nmore\njax.errors.JaxRuntimeError: last\n", "jax.errors.JaxRuntimeError: last"),
    ("one line", "one line"),
    ("", "no output"),
    ("  \n\n", "no output"),
])
def test_the_error_line_is_the_last_said(bench, text, want):
    assert bench.first_line(text) == want


def test_the_error_line_is_short(bench):
    assert len(bench.first_line("x" * 1000)) <= 160


@pytest.mark.parametrize("shape", [(5,), (2, 3), (1, 4, 4, 2)])
def test_cosine_is_one_for_a_scaled_copy_and_zero_for_orthogonal(bench, shape):
    a = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    assert bench.cosine(a, 3 * a) == pytest.approx(1.0, abs=1e-6)
    assert bench.cosine(a, -a) == pytest.approx(-1.0, abs=1e-6)
    flat = a.ravel()
    other = np.roll(flat, 1) - flat * (flat @ np.roll(flat, 1)) / (flat @ flat)
    assert bench.cosine(flat, other) == pytest.approx(0.0, abs=1e-5)


def test_cosine_of_zeros(bench):
    zeros = np.zeros(4)
    assert bench.cosine(zeros, zeros) == 1.0
    assert bench.cosine(zeros, np.ones(4)) == 0.0


@pytest.mark.slow
def test_the_benchmark_runs_both_converters():
    done = subprocess.run([sys.executable, str(SCRIPT), "--models", "sort", "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stderr[-2000:]
    [found] = json.loads(done.stdout)["rows"]
    for side in ("edgebuild", "peer"):
        assert found[side]["converts"], found[side]
        assert found[side]["cosine"] > 0.999
    assert found["ratio"] > 0
