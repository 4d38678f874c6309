"""``matrix:`` expansion: names, overrides, exclusions, ``--matrix``, and file:line errors."""

from __future__ import annotations

import pytest

from edgebuild.build.summary import plain_lines, rows, worst_metric
from edgebuild.errors import RecipeError, UsageError
from edgebuild.recipe import load_recipe
from edgebuild.recipe.matrix import parse_axes

BASE = """\
edgebuild: 1
name: demo
source:
  model: m.onnx
  inputs: {x: {shape: [1, 3, 8, 8], dtype: float32}}
target: {backend: testcopy}
"""


def variants(tmp_path, text: str, **kwargs):
    path = tmp_path / "recipe.yaml"
    path.write_text(BASE + text)
    return load_recipe(path, **kwargs)


def test_axes_cross_into_variants_named_in_a_fixed_axis_order(tmp_path):
    found = variants(tmp_path, """\
matrix:
  chips: [m1, m3]
  compression:
    int8: {mode: linear, dtype: int8}
    pal4: {mode: palettize, nbits: 4}
  precision: [float16, float32]
""")
    names = [v.name for v in found]
    assert names == [f"{p}-{c}-{k}" for p in ("fp16", "fp32") for c in ("m1", "m3") for k in ("int8", "pal4")]
    by_name = {v.name: v for v in found}
    one = by_name["fp32-m3-pal4"]
    assert one.recipe.target.precision == "float32"
    assert one.recipe.compute.chip == "m3"
    assert one.recipe.compression == {"mode": "palettize", "nbits": 4}
    assert by_name["fp16-m1-int8"].recipe.target.precision == "float16"
    assert by_name["fp16-m1-int8"].recipe.target.backend == "testcopy"  # the base is kept


def test_null_compression_value_turns_compression_off_and_explicit_variants_stay(tmp_path):
    found = variants(tmp_path, """\
compression: {mode: linear, dtype: int8}
variants:
  reference: {target: {precision: float32}, compression: null}
matrix:
  chips: [a17]
  compression: {none: null, int8: {mode: linear, dtype: int8}}
""")
    by_name = {v.name: v for v in found}
    assert list(by_name) == ["reference", "a17-none", "a17-int8"]
    assert by_name["a17-none"].recipe.compression is None
    assert by_name["a17-int8"].recipe.compression == {"mode": "linear", "dtype": "int8"}
    assert by_name["reference"].recipe.compute.chip == "m3"


def test_custom_axis_overrides_the_whole_recipe(tmp_path):
    found = variants(tmp_path, """\
matrix:
  size:
    small: {source: {inputs: {x: {shape: [1, 3, 4, 4]}}}}
    large: {source: {inputs: {x: {shape: [1, 3, 16, 16]}}}}
  precision: [float32]
""")
    assert [v.name for v in found] == ["fp32-small", "fp32-large"]
    assert found[1].recipe.source.inputs["x"].shape == [1, 3, 16, 16]
    assert found[1].recipe.source.inputs["x"].dtype == "float32"  # deep-merged


def test_exclude_leaves_combinations_out(tmp_path):
    found = variants(tmp_path, """\
matrix:
  precision: [float16, float32]
  chips: [m1, a17]
  exclude:
    - {precision: float32, chips: a17}
    - {precision: fp16, chips: m1}
""")
    assert [v.name for v in found] == ["fp16-a17", "fp32-m1"]


def test_command_line_axes_set_list_axes_and_narrow_named_ones(tmp_path):
    text = """\
matrix:
  precision: [float16, float32]
  compression: {int8: {mode: linear, dtype: int8}, pal4: {mode: palettize, nbits: 4}}
"""
    given = parse_axes(["chips=m1,m3", "compression=pal4", "precision=float32"])
    assert given == {"chips": ["m1", "m3"], "compression": ["pal4"], "precision": ["float32"]}
    assert [v.name for v in variants(tmp_path, text, matrix=given)] == ["fp32-m1-pal4", "fp32-m3-pal4"]
    # a recipe without a matrix gets one from the command line
    assert [v.name for v in variants(tmp_path, "", matrix={"chips": ["m1", "a17"]})] == ["m1", "a17"]
    with pytest.raises(UsageError, match="has no value 'int4'.*int8, pal4"):
        variants(tmp_path, text, matrix={"compression": ["int4"]})
    assert [v.name for v in variants(tmp_path, text, matrix={"precision": ["fp16"]})] == ["fp16-int8", "fp16-pal4"]
    with pytest.raises(UsageError, match="'half' is not a precision"):
        variants(tmp_path, text, matrix={"precision": ["half"]})
    with pytest.raises(UsageError, match="no matrix axis 'size'"):
        variants(tmp_path, text, matrix={"size": ["small"]})
    for bad in ("chips", "chips=", "=m1", "exclude=x"):
        with pytest.raises(UsageError, match="--matrix"):
            parse_axes([bad])


def test_only_picks_matrix_variants_by_name(tmp_path):
    found = variants(tmp_path, "matrix: {chips: [m1, m3, a17]}\n", only=["a17"])
    assert [v.name for v in found] == ["a17"]


def test_matrix_variants_share_the_base_stage_parameters(tmp_path):
    """Only what an axis sets differs: import and optimize read neither chip nor precision."""
    found = variants(tmp_path, "matrix: {chips: [m1, m3], precision: [float16, float32]}\n")
    params = [v.params for v in found]
    assert all(p["source"] == params[0]["source"] and p["optimize"] == params[0]["optimize"] for p in params)
    assert len({(p["compute"]["chip"], p["target"]["precision"]) for p in params}) == 4


ERRORS = [
    # (matrix section, "recipe.yaml:line:col ... message" fragment)
    ("matrix:\n  chips: m1\n", "recipe.yaml:8:10 matrix.chips: give a list of at least one value"),
    ("matrix:\n  chips: []\n", "recipe.yaml:8:10 matrix.chips: give a list of at least one value"),
    ("matrix:\n  precision: [float16, bfloat16]\n", "recipe.yaml:8:24 matrix.precision.1: must be one of float16, float32"),
    ("matrix:\n  chips: [m1, m1]\n", "recipe.yaml:8:10 matrix.chips: 'm1' is listed twice"),
    ("matrix:\n  size: [small, large]\n", "recipe.yaml:8:9 matrix.size: give a mapping of value names to overrides"),
    ("matrix:\n  compression: {int8: linear}\n", "recipe.yaml:8:17 matrix.compression.int8: give the compression section"),
    ("matrix:\n  chips: [m1]\n  exclude: [{chip: m1}]\n", "recipe.yaml:9:14 matrix.exclude[0]: no axis 'chip'"),
    ("matrix:\n  chips: [m1, m3]\n  exclude: [{chips: m2}]\n", "recipe.yaml:9:21 matrix.exclude[0].chips: 'm2' is not one of m1, m3"),
    ("matrix:\n  chips: [m1]\n  exclude: [{chips: m1}]\n", "matrix: exclude: leaves out every combination"),
    ("matrix:\n  chips: [m1, 'm/3']\n", "recipe.yaml:8:3 matrix: variant m/3: 'm/3' is not a valid variant name"),
    ("matrix:\n  a: {x-y: {}, x: {}}\n  b: {z: {}, y-z: {}}\n", "recipe.yaml:8:3 matrix: two combinations are both named 'x-y-z'"),
    ("variants:\n  fp16-m1: {}\nmatrix:\n  chips: [m1]\n  precision: [float16]\n",
     ("recipe.yaml:10:3 matrix: makes a variant named 'fp16-m1' (precision=float16, chips=m1), which variants: "
      "defines too (at recipe.yaml:8:3)")),
    ("matrix:\n  size: {big: {variants: {}}}\n", "matrix.size.big: a matrix value cannot set variants"),
]


@pytest.mark.parametrize("text, expected", ERRORS, ids=[e[1].split(": ", 1)[-1][:40] for e in ERRORS])
def test_bad_matrix_is_a_file_line_error(tmp_path, monkeypatch, text, expected):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RecipeError) as error:
        variants(tmp_path, text)
    assert expected in str(error.value)
    assert error.value.exit_code == 2


def test_an_error_in_a_value_points_into_the_matrix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RecipeError) as error:
        variants(tmp_path, "matrix:\n  size:\n    big: {target: {precision: half}}\n")
    assert "recipe.yaml:9:31 target.precision: must be one of float16, float32" in str(error.value)
    assert "(in variant 'big')" in str(error.value)
    # an error of the recipe itself still points at the recipe, not into the matrix
    path = tmp_path / "recipe.yaml"
    path.write_text(BASE.replace("name: demo\n", "") + "matrix: {size: {small: null}}\n")
    with pytest.raises(RecipeError) as error:
        load_recipe(path)
    assert "recipe.yaml:1:1 name: required key is missing" in str(error.value)


VALIDATION = {
    "runtimes": {"interpreter": {
        "metrics": {"y": {"cosine": {"min": 0.99995, "max": 1.0}, "max_abs": {"min": 0.0, "max": 0.002}}},
        "limits": {"y": {"cosine_min": 0.9999, "max_abs_max": 0.01}},
        "failures": []}},
    "failures": [],
}


def test_worst_metric_is_the_one_closest_to_its_limit():
    # 1 − cosine: half its room used; max_abs a fifth
    assert worst_metric(VALIDATION) == "1 − cosine 5e-05 (limit 0.0001)"
    failed = {**VALIDATION, "failures": [{"metric": "max_abs", "value": 0.5, "limit": 0.01}]}
    assert worst_metric(failed) == "max_abs 0.5 (limit 0.01, missed)"
    unlimited = {"runtimes": {"r": {"metrics": VALIDATION["runtimes"]["interpreter"]["metrics"]}}}
    assert worst_metric(unlimited) == "1 − cosine 5e-05"
    assert worst_metric({}) == ""


def test_summary_lines_hold_a_row_per_variant():
    records = [
        {"recipe": "demo", "variant": "fp16-m1", "status": "built", "artifact_sizes": {"a": 2_500_000},
         "stages": [{"status": "cached", "seconds": 0.0}, {"status": "ran", "seconds": 1.25}],
         "validation": VALIDATION},
        {"recipe": "demo", "variant": "fp32-m1", "status": "failed", "artifact_sizes": {}, "stages": [],
         "validation": {}, "error": "lower: boom"},
    ]
    lines = plain_lines(rows(records))
    assert lines[0].split() == ["variant", "status", "size", "worst", "metric", "seconds", "cached/ran"]
    assert lines[1].split()[0] == "demo:fp16-m1" and " validation passed " in lines[1]
    assert "1 − cosine 5e-05 (limit 0.0001)" in lines[1] and lines[1].endswith("1/1")
    assert lines[2].split()[:2] == ["demo:fp32-m1", "error"] and lines[2].endswith("0/0")
