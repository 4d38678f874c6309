"""Flexible recipe shapes: whole-shape enumerations, the per-dim view, and the shape sets
validation runs at (edgebuild/recipe/shapes.py, edgebuild/verify/shapes.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from edgebuild.recipe.model import EnumeratedDim, EnumeratedShapes, InputSpec
from edgebuild.recipe.shapes import has_range, per_dim, whole_shapes
from edgebuild.verify.shapes import range_sizes, shape_sets


def test_whole_shape_enumeration_parses_and_reads_per_dim():
    spec = InputSpec.model_validate({"shape": {"enumerated": [[1, 512], [1, 1024]]}, "dtype": "int64"})
    assert isinstance(spec.shape, EnumeratedShapes)
    assert spec.dims == [1, EnumeratedDim(enumerated=[512, 1024])]
    as_json = spec.model_dump()["shape"]
    assert whole_shapes(as_json) == [[1, 512], [1, 1024]]
    assert per_dim(as_json) == [1, {"enumerated": [512, 1024]}]
    assert not has_range(as_json)


def test_per_dim_shapes_are_unchanged():
    spec = InputSpec.model_validate({"shape": [1, {"range": [1, 4096]}]})
    shape = spec.model_dump()["shape"]
    assert whole_shapes(shape) is None and has_range(shape)
    assert per_dim(shape)[0] == 1


def test_enumerated_shapes_of_different_ranks_are_refused():
    with pytest.raises(ValidationError, match="ranks \\[2, 3\\]"):
        InputSpec.model_validate({"shape": {"enumerated": [[1, 512], [1, 2, 3]]}})


def test_range_sizes_are_the_ends_and_a_seeded_size_inside():
    low, high, middle = range_sizes(1, 256)
    assert (low, high) == (1, 256) and 1 <= middle <= 256
    assert range_sizes(1, 256) == range_sizes(1, 256)


def _specs(**shapes):
    return {name: {"shape": shape, "dtype": "float32"} for name, shape in shapes.items()}


def test_inputs_sharing_a_range_stay_consistent():
    flexible = {"shape": [1, {"range": [1, 256]}]}
    sets = shape_sets(_specs(ids=[1, 1], mask=[1, 1]), {"ids": flexible, "mask": flexible})
    assert [(s["ids"]["shape"], s["mask"]["shape"]) for s in sets] == [([1, n], [1, n]) for n in range_sizes(1, 256)]


def test_every_enumerated_shape_is_a_set_and_pinned_inputs_keep_theirs():
    recipe = {"x": {"shape": {"enumerated": [[1, 512], [1, 1024]]}}, "h": {"shape": [1, 8]}}
    sets = shape_sets(_specs(x=[1, 512], h=[1, 8]), recipe)
    assert [(s["x"]["shape"], s["h"]["shape"]) for s in sets] == [([1, 512], [1, 8]), ([1, 1024], [1, 8])]


def test_per_dim_enumerations_take_every_combination():
    recipe = {"x": {"shape": [{"enumerated": [1, 2]}, 3, {"enumerated": [4, 8]}]}}
    sets = shape_sets(_specs(x=[1, 3, 4]), recipe)
    assert [s["x"]["shape"] for s in sets] == [[1, 3, 4], [1, 3, 8], [2, 3, 4], [2, 3, 8]]


def test_a_range_and_an_enumeration_cycle_through_the_shorter_list():
    recipe = {"a": {"shape": [{"range": [2, 10]}]}, "b": {"shape": {"enumerated": [[5], [6]]}}}
    sets = shape_sets(_specs(a=[2], b=[5]), recipe)
    sizes = list(dict.fromkeys(range_sizes(2, 10)))  # a random size equal to an end is validated once
    count = max(len(sizes), 2)
    assert [(s["a"]["shape"], s["b"]["shape"]) for s in sets] == [
        ([sizes[i % len(sizes)]], [[5, 6][i % 2]]) for i in range(count)]


def test_fixed_shapes_give_one_set():
    specs = _specs(x=[1, 3])
    assert shape_sets(specs, {"x": {"shape": [1, 3]}}) == [specs]
