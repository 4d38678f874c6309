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


def test_schema_prints_what_make_schema_writes_and_the_committed_check_compares(cli):
    code, out, err = cli("schema")
    assert code == 0, err
    assert out == docsgen.schema_text()  # plugins/coreml/tests keep the committed file equal to it
    assert "x-edgebuild-sections" in json.loads(out)


def _committed_copy(tmp_path: Path) -> tuple[Path, bytes]:
    out = tmp_path / "recipe.schema.json"
    out.write_bytes(docsgen.SCHEMA_PATH.read_bytes())
    return out, out.read_bytes()


def test_schema_refuses_to_drop_the_sections_of_plugins_not_installed(tmp_path, cli, core_plugins_only):
    out, before = _committed_copy(tmp_path)
    code, stdout, err = cli("schema", "--out", out)
    assert code == 2 and stdout == ""
    assert out.read_bytes() == before  # untouched
    for section, dist in [("bundle:target.options", "edgebuild-mpsgraph"), ("coreml:compression", "edgebuild-coreml"),
                          ("pytorch:source.options", "edgebuild-pytorch")]:
        assert f"{section} ({dist})" in err
    assert "pip install ./plugins/coreml" in err and "--force" in err


def test_schema_force_writes_the_smaller_schema_and_then_replaces_it_freely(tmp_path, cli, core_plugins_only):
    out, _ = _committed_copy(tmp_path)
    code, _, err = cli("schema", "--out", out, "--force")
    assert code == 0, err
    written = json.loads(out.read_text())
    assert written["x-edgebuild-sections"] == {} and "coreml_compression" not in written["$defs"]
    assert cli("schema", "--out", out)[0] == 0  # nothing left to lose


def test_schema_refuses_an_older_schema_by_its_section_definitions(tmp_path, cli, core_plugins_only):
    out, _ = _committed_copy(tmp_path)
    old = json.loads(out.read_text())
    del old["x-edgebuild-sections"]  # as written before the sections were recorded
    out.write_text(json.dumps(old))
    code, _, err = cli("schema", "--out", out)
    assert code == 2 and "coreml:compression (edgebuild-coreml)" in err


def test_schema_refuses_to_replace_a_file_that_is_no_recipe_schema(tmp_path, cli):
    other = tmp_path / "package.json"
    other.write_text('{"name": "app"}\n')
    code, _, err = cli("schema", "--out", other)
    assert code == 2 and "not a recipe schema" in err
    assert other.read_text() == '{"name": "app"}\n'
    fresh = tmp_path / "new.schema.json"
    assert cli("schema", "--out", fresh)[0] == 0 and json.loads(fresh.read_text())["title"] == "edgebuild recipe"
