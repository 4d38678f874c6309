"""The committed recipe schema validates an example recipe (that it and the reference are
current, with every first-party plugin's sections, is tested with the Core ML plugin)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgebuild.recipe import docsgen


def test_schema_validates_an_example_recipe():
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    schema = json.loads(docsgen.SCHEMA_PATH.read_text())
    data = yaml.safe_load((docsgen.ROOT / "recipes" / "orientation.yaml").read_text())
    jsonschema.validate(data, schema)
    data["target"]["precision"] = "float8"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, schema)
