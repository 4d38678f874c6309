"""``edgebuild verify``'s reference choice: which frontend reads a reference, and ``--shape`` pins."""

from pathlib import Path

import pytest

from edgebuild.errors import UsageError
from edgebuild.recipe.formats import SUFFIXES
from edgebuild.verify.against import parse_shapes, reference_format


@pytest.mark.parametrize("suffix, fmt", sorted(SUFFIXES.items()))
def test_a_reference_is_read_by_the_frontend_its_suffix_names(suffix, fmt):
    assert reference_format(Path(f"models/m{suffix}")) == fmt
    assert reference_format(Path(f"models/M{suffix.upper()}")) == fmt


@pytest.mark.parametrize("name", ["model", "model.bin", "weights.npz"])
def test_any_other_reference_is_taken_for_onnx(name):
    assert reference_format(Path(name)) == "onnx"  # and the ONNX check names what is wrong with it


@pytest.mark.parametrize("given, want", [
    ([], {}),
    (["x=1,3,224,224"], {"x": [1, 3, 224, 224]}),
    (["x=2,16", "mask=2"], {"x": [2, 16], "mask": [2]}),
    ([" ids = 4,8"], {"ids": [4, 8]}),
    (["input.1=7"], {"input.1": [7]}),
    (["scalar="], {"scalar": []}),
])
def test_shapes_parse(given, want):
    assert parse_shapes(given) == want


@pytest.mark.parametrize("given, phrase", [
    (["x"], "expected NAME=D,D,..."),
    (["=1,2"], "expected NAME=D,D,..."),
    (["x=1,,2"], "expected NAME=D,D,..."),
    (["x=1.5"], "expected NAME=D,D,..."),
    (["x=0,3"], "positive sizes"),
    (["x=-1,3"], "positive sizes"),
    (["x=1", "x=2"], "--shape x: given twice"),
])
def test_a_malformed_shape_is_a_usage_error(given, phrase):
    with pytest.raises(UsageError) as refused:
        parse_shapes(given)
    assert phrase in refused.value.message
