"""benchmarks/stablehlo.py: what it measures is judged from fake measurements here (the tables, the
ratios, the recipes it builds with, the inputs verify draws, the constraints it installs the peer
with, the conformance summary); installing and running the peer is the slow test."""

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


# --- numerics through verify ---------------------------------------------------------------------

def metrics_record(*per_runtime):
    return {"runtimes": {f"r{i}": {"metrics": {name: {"cosine": {"min": value}} for name, value in outputs.items()}}
                         for i, outputs in enumerate(per_runtime)}}


@pytest.mark.parametrize("outputs, want", [
    ([{"a": 0.99, "b": 0.5}], 0.5),
    ([{"a": 1.0}, {"a": 0.2}], 0.2),
    ([{"a": -0.3, "b": 0.9}], -0.3),
    ([{}], None),
])
def test_the_lowest_cosine_is_over_every_output_and_runtime(bench, outputs, want):
    found = bench.lowest_cosine(metrics_record(*outputs))
    assert found == (pytest.approx(want) if want is not None else None)


def test_the_lowest_cosine_skips_outputs_without_one(bench):
    record = {"runtimes": {"r": {"metrics": {"a": {"max_abs": {"max": 1.0}}, "b": {"cosine": {"min": 0.7}}}}}}
    assert bench.lowest_cosine(record) == pytest.approx(0.7)


@pytest.mark.parametrize("dtype", ["int32", "int16", "uint32", "uint8"])
def test_integer_inputs_are_drawn_from_their_inclusive_range(bench, dtype):
    section = bench.verify_section({"ids": {"shape": [2, 8], "dtype": dtype}}, {"ids": (3, 7)})
    assert section["inputs"]["ids"]["random"]["low"] == 3 and section["inputs"]["ids"]["random"]["high"] == 8
    default = bench.verify_section({"ids": {"shape": [2], "dtype": dtype}}, {})["inputs"]["ids"]["random"]
    assert (default["low"], default["high"]) == ((0, 10) if dtype.startswith("u") else (-9, 10))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_float_inputs_are_normal_unless_given_a_range(bench, dtype):
    specs = {"x": {"shape": [3], "dtype": dtype}, "y": {"shape": [3], "dtype": dtype}}
    inputs = bench.verify_section(specs, {"y": (0.1, 3.0)})["inputs"]
    assert inputs["x"]["random"]["distribution"] == "normal"
    assert (inputs["y"]["random"]["low"], inputs["y"]["random"]["high"]) == (0.1, 3.0)


def test_the_section_validates_and_draws_what_it_says(bench):
    from edgebuild.recipe.validation import ValidateSection
    from edgebuild.verify.inputs import generate_inputs

    specs = {"x": {"shape": [4, 5], "dtype": "float32"}, "i": {"shape": [6], "dtype": "int32"},
             "p": {"shape": [3], "dtype": "bool"}, "u": {"shape": [4], "dtype": "float32"}}
    section = ValidateSection.model_validate(bench.verify_section(specs, {"i": (1, 3), "u": (0.1, 3.0)}, samples=3,
                                                                  thresholds={"cosine_min": 0.999}))
    samples = generate_inputs(section, specs, Path("."))
    assert len(samples) == 3
    for sample in samples:
        assert sample["i"].dtype == np.int32 and sample["i"].min() >= 1 and sample["i"].max() <= 3
        assert sample["p"].dtype == np.bool_ and sample["x"].shape == (4, 5)
        assert sample["u"].min() >= 0.1 and sample["u"].max() < 3.0
    assert section.thresholds.cosine_min == 0.999


def test_a_package_verify_cannot_read_is_a_finding(bench, tmp_path):
    found = bench.verify_package(str(tmp_path / "missing.mlpackage"), tmp_path / "m.jaxexport",
                                 bench.verify_section({}, {}))
    assert found["correct"] is False and found["cosine"] is None and "no such artifact" in found["run_error"]


# --- the peer's process ---------------------------------------------------------------------------

def test_the_peer_case_names_the_files_and_the_exports_names(bench, tmp_path):
    case = bench.peer_case(tmp_path, "m", ["x", "mask"], ["logits"])
    assert case["text"].endswith("m.mlir") and case["artifact"].endswith("m.stablehlo")
    assert case["out"].endswith("m.peer.mlpackage")
    assert case["inputs"] == ["x", "mask"] and case["outputs"] == ["logits"]


def test_the_peers_lines_are_read_by_case(bench):
    out = ('Running MIL default pipeline: 100%\n{"name": "a", "converts": true, "seconds": 0.5}\n'
           'not json\n[1, 2]\n{"name": "b", "converts": false, "error": "ValueError: x"}\n')
    assert bench.peer_results(out) == {"a": {"converts": True, "seconds": 0.5},
                                       "b": {"converts": False, "error": "ValueError: x"}}


FAKE_PEER = r"""
import json, sys
job = json.load(open(sys.argv[1]))
for case in job["cases"]:
    if case["name"].startswith("crash"):
        print("Fatal Python error: Aborted", file=sys.stderr)
        sys.exit(134)
    print(json.dumps({"name": case["name"], "converts": True, "seconds": 0.1, "read_from": job["precision"]}))
"""


def test_a_case_that_takes_the_peer_down_is_marked_and_the_rest_still_run(bench, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "PEER_CONVERT", FAKE_PEER)
    cases = [bench.peer_case(tmp_path, name, ["x"], ["y"]) for name in ("a", "crash_1", "b", "crash_2", "c")]
    results, _ = bench.run_peer(Path(sys.executable), tmp_path, cases, "float32")
    assert set(results) == {case["name"] for case in cases}
    for name in ("a", "b", "c"):
        assert results[name]["converts"] and results[name]["read_from"] == "float32"
        assert results[name]["package"].endswith(f"{name}.peer.mlpackage")
    for name in ("crash_1", "crash_2"):
        assert not results[name]["converts"] and results[name]["error"] == "Fatal Python error: Aborted"


# --- edgebuild's run -------------------------------------------------------------------------------

@pytest.mark.parametrize("precision", ["float16", "float32"])
def test_the_conformance_recipe_has_no_validate_stage(bench, precision):
    recipe = yaml.safe_load(bench.recipe_text("lax_add_float32", precision=precision, validate=False))
    assert "validate" not in recipe and recipe["target"]["precision"] == precision
    assert recipe["source"] == {"model": "lax_add_float32.jaxexport"}


def test_a_built_variant_gives_its_package_and_work_seconds(bench, tmp_path):
    package = tmp_path / "m.edgebuild" / "default" / "model.mlpackage"
    package.mkdir(parents=True)
    variant = {"recipe": "m", "status": "built", "stages": [{"name": "resolve", "seconds": 5.0},
                                                            {"name": "import", "seconds": 1.0},
                                                            {"name": "lower", "seconds": 2.0},
                                                            {"name": "validate", "seconds": 9.0}]}
    found = bench.edgebuild_result(tmp_path, "m", variant, "unused")
    assert found["converts"] and found["package"] == str(package) and found["work_s"] == pytest.approx(3.0)


@pytest.mark.parametrize("variant, fallback, want", [
    ({"recipe": "m", "status": "failed", "stages": [], "error": "m.jaxexport: stablehlo.popcnt ...\n  hint: x"},
     "unused", "m.jaxexport: stablehlo.popcnt ..."),
    (None, "Traceback\nRuntimeError: the run died", "RuntimeError: the run died"),
])
def test_a_variant_without_a_package_says_why(bench, tmp_path, variant, fallback, want):
    found = bench.edgebuild_result(tmp_path, "m", variant, fallback)
    assert not found["converts"] and found["error"] == want


@pytest.mark.parametrize("stdout, want", [
    ('{"variants": [{"recipe": "a"}, {"recipe": "b"}], "version": "1"}', {"a", "b"}),
    ("", set()),
    ("Traceback ...", set()),
    ('{"error": {"kind": "usage"}}', set()),
])
def test_the_runs_variants_are_read_by_recipe(bench, stdout, want):
    assert set(bench.built_variants(stdout)) == want


# --- conformance -----------------------------------------------------------------------------------

@pytest.mark.parametrize("specs, want", [
    ([((6, 4), np.float32), ((3,), np.int32, "positive")], {"b": (1, 3)}),
    ([((5, 7), np.float32), ((), np.int32, "positive")], {"b": (1, 4)}),
    ([((20, 16), np.float32), ((3,), np.int32, "positive")], {"b": (1, 9)}),
    ([((4, 6), np.int32), ((4, 6), np.int32, "positive")], {"a": (-9, 9), "b": (1, 3)}),
    ([((4,), np.uint32), ((4,), np.uint32, "positive")], {"a": (0, 9), "b": (1, 3)}),
    ([((4, 6), np.float32, "positive"), ((4, 6), np.float32)], {"a": (0.1, 3.0)}),
    ([((4, 6), np.bool_), ((4, 6), np.float32)], {}),
    ([((2, 1), np.float32), ((), np.int32, "positive")], {"b": (1, 1)}),
])
def test_conformance_inputs_are_drawn_as_the_suite_draws_them(bench, specs, want):
    assert bench.case_ranges(["a", "b"], specs) == want


@pytest.mark.parametrize("primitive", ["lax.log1p"])
def test_a_primitives_floats_are_drawn_inside_its_domain(bench, primitive):
    low, high = bench.case_ranges(["x"], [((3, 5), np.float32)], primitive)["x"]
    assert (low, high) == bench.DOMAINS[primitive] and low < high
    assert bench.case_ranges(["x"], [((3, 5), np.float32)], "lax.exp") == {}


@pytest.mark.parametrize("last, want", [(np.float16, 0.999), (np.float32, 0.9999), (np.int32, 0.9999),
                                        (np.bool_, 0.9999)])
def test_correct_is_judged_at_the_cases_dtype(bench, last, want):
    found = bench.case_thresholds([((3,), np.float32), ((3,), last)])
    assert found["cosine_min"] == want and found["max_rel_max"] > 0


def case_row(name, primitive, ours, theirs):
    return {"case": name, "primitive": primitive, "edgebuild": ours, "peer": theirs}


def outcome(converts, correct=None, error=None):
    return {"converts": converts, "correct": bool(converts and correct), "error": error,
            "failures": [] if correct else ["output 'result': cosine 0.5 < cosine_min 0.9999"], "run_error": None}


@pytest.mark.parametrize("converts, verified, want", [
    (True, {"correct": True, "cosine": 1.0}, True),
    (True, {"correct": False, "cosine": 0.5}, False),
    (True, None, False),
    (False, None, False),
])
def test_a_case_is_correct_only_when_converted_and_verified(bench, converts, verified, want):
    found = bench.judged({"converts": converts, "error": None if converts else "no"}, verified)
    assert found["converts"] is converts and found["correct"] is want


@pytest.mark.parametrize("count, total, want", [(3, 3, "yes"), (0, 3, "no"), (2, 3, "2/3"), (1, 1, "yes"),
                                                (0, 1, "no")])
def test_a_share_is_yes_no_or_how_many(bench, count, total, want):
    assert bench.share(count, total) == want


def suite_rows():
    return [case_row("lax_add_f32", "lax.add", outcome(True, True), outcome(True, True)),
            case_row("lax_add_i32", "lax.add", outcome(True, True), outcome(True, False)),
            case_row("lax_sort_one", "lax.sort", outcome(True, True), outcome(True, True)),
            case_row("lax_sort_two", "lax.sort", outcome(True, False), outcome(False, None, "ValueError: stable")),
            case_row("lax_top_k_2", "lax.top_k", outcome(False, None, "error: no converter"), outcome(True, True))]


def test_the_summary_counts_each_tool_per_primitive_in_the_suites_order(bench):
    summary = bench.summarise(suite_rows())
    assert [e["primitive"] for e in summary] == ["lax.add", "lax.sort", "lax.top_k"]
    add, sort, top_k = summary
    assert add["cases"] == 2 and add["edgebuild"] == {"converts": 2, "correct": 2}
    assert add["peer"] == {"converts": 2, "correct": 1}
    assert sort["edgebuild"] == {"converts": 2, "correct": 1} and sort["peer"] == {"converts": 1, "correct": 1}
    assert top_k["edgebuild"] == {"converts": 0, "correct": 0} and top_k["peer"] == {"converts": 1, "correct": 1}


def test_the_totals_count_cases_and_whole_primitives(bench):
    found = bench.totals(bench.summarise(suite_rows()))
    assert found["cases"] == 5 and found["primitives"] == 3
    assert found["edgebuild"] == {"cases_converted": 4, "cases_correct": 3, "primitives_converted": 2,
                                  "primitives_correct": 1}
    assert found["peer"] == {"cases_converted": 4, "cases_correct": 3, "primitives_converted": 2,
                             "primitives_correct": 1}


def test_the_conformance_table_shows_each_primitive_and_the_totals(bench):
    summary = bench.summarise(suite_rows())
    lines = bench.conformance_table(summary, bench.totals(summary)).splitlines()
    assert lines[0].split() == ["primitive", "cases", "edgebuild", "converts", "correct", "peer", "converts",
                                "correct"]
    assert set(lines[1]) == {"-"} and set(lines[-3]) == {"-"} and len(lines) == 3 + len(summary) + 2
    assert lines[2].split() == ["lax.add", "2", "yes", "yes", "yes", "1/2"]
    assert lines[3].split() == ["lax.sort", "2", "yes", "1/2", "1/2", "1/2"]
    assert lines[4].split() == ["lax.top_k", "1", "no", "no", "yes", "yes"]
    assert lines[-2].split() == ["total", "5", "4/5", "3/5", "4/5", "3/5"]
    assert lines[-1].split() == ["primitives,", "all", "cases", "3", "2/3", "1/3", "2/3", "1/3"]
    starts = {line.index(line.split()[2]) for line in lines[2:5]}
    assert starts == {lines[0].index("edgebuild")}


def test_why_not_names_each_case_a_tool_misses_and_why(bench):
    lines = bench.why_not(suite_rows())
    assert lines == [
        "lax_add_i32  peer  wrong: output 'result': cosine 0.5 < cosine_min 0.9999",
        "lax_sort_two  edgebuild  wrong: output 'result': cosine 0.5 < cosine_min 0.9999",
        "lax_sort_two  peer  not converted: ValueError: stable",
        "lax_top_k_2  edgebuild  not converted: error: no converter",
    ]


def test_the_conformance_cases_are_the_suites(bench):
    from edgebuild_jax.conformance import collect_cases

    cases = bench.conformance_cases(["lax.sort", "add"])
    suite = collect_cases(["lax.sort", "add"])
    assert [c["name"] for c in cases] == [c.name for c in suite]
    assert {c["primitive"] for c in cases} == {"lax.sort", "lax.add"}
    assert len({c["name"] for c in bench.conformance_cases()}) == len(bench.conformance_cases())


def test_the_conformance_json_is_json(bench):
    rows = suite_rows()
    summary = bench.summarise(rows)
    found = json.loads(json.dumps({"cases": rows, "primitives": summary, "totals": bench.totals(summary)}))
    assert found["totals"]["edgebuild"]["cases_correct"] == 3
