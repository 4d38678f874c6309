"""The committed recipe schema and recipe reference are current, and the shipped recipes
validate. Both need every first-party plugin installed (the schema holds the sections they
own, the recipes name their backends and frontends), as the full test environment has them."""

from __future__ import annotations

import json

import pytest

from edgebuild.build.jobs import load_variants
from edgebuild.recipe import docsgen
from edgebuild.registry import get_registry

RECIPES = sorted((docsgen.ROOT / "recipes").glob("*.yaml"))


def test_committed_schema_is_current():
    assert docsgen.SCHEMA_PATH.read_text() == docsgen.schema_text(), "run `make schema` (or `make docs`)"


def test_committed_reference_is_current():
    expected = docsgen.reference_text(json.loads(docsgen.schema_text()))
    assert docsgen.REFERENCE_PATH.read_text() == expected, "run `make docs`"


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_example_recipes_carry_schema_comment_and_validate(recipe):
    assert recipe.read_text().startswith("# yaml-language-server: $schema=../schemas/recipe.schema.json")
    variants = load_variants([str(recipe)], None, get_registry())
    assert variants
