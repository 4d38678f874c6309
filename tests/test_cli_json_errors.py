"""With --json, a command that fails on its command line or its recipe still prints exactly one
JSON object on stdout ({"error": {...}, "version"}), the human message on stderr, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgebuild_testplugin.recipes import RECIPE

ERROR_FIELDS = {"kind", "file", "line", "column", "message", "hint"}

# a recipe whose line 6 names a precision no backend has
BAD_RECIPE = RECIPE.format(extra="").replace("precision: float32", "precision: float9")

# command -> its arguments before --json, for each kind of mistake it can be given
RECIPE_COMMANDS = {"run": [], "validate": [], "plan": []}
CASES = [
    *[(command, "bad_recipe", ["bad.yaml"]) for command in RECIPE_COMMANDS],
    *[(command, "missing_file", ["missing.yaml"]) for command in RECIPE_COMMANDS],
    ("inspect", "missing_file", ["missing.mlpackage"]),
    ("verify", "missing_file", ["missing.mlpackage", "--reference", "tiny.onnx"]),
    *[(command, "unknown_option", [*(["recipe.yaml"] if command in RECIPE_COMMANDS else []), "--no-such-option"])
      for command in ("run", "validate", "plan", "plugins")],
    ("inspect", "unknown_option", ["missing.mlpackage", "--no-such-option"]),
    ("verify", "unknown_option", ["missing.mlpackage", "--reference", "tiny.onnx", "--no-such-option"]),
    ("cache info", "unknown_option", ["--no-such-option"]),
    ("cache ls", "unknown_option", ["--no-such-option"]),
    ("cache info", "missing_file", ["--cache-dir", "a-file"]),  # a file where the store should be
    ("cache ls", "missing_file", ["--cache-dir", "a-file"]),
]


def _one_object(stdout: str) -> dict:
    """stdout holds one JSON object and nothing else."""
    assert stdout.endswith("\n") and stdout.count("\n") == 1, stdout
    data = json.loads(stdout)
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize(("command", "case", "args"), CASES, ids=[f"{c}-{k}" for c, k, _ in CASES])
def test_a_failing_json_command_prints_one_error_object(project, cli, command, case, args):
    project()
    Path("bad.yaml").write_text(BAD_RECIPE)
    Path("a-file").write_text("not a directory\n")
    code, out, err = cli(*command.split(), *args, "--json")
    assert code == 2, err
    data = _one_object(out)
    assert set(data["error"]) == ERROR_FIELDS and isinstance(data["version"], str) and data["version"]
    error = data["error"]
    assert error["message"] and error["message"].splitlines()[0] in err  # the human message is on stderr
    assert "Traceback" not in err
    if case == "bad_recipe":
        assert error["kind"] == "recipe"
        assert (error["file"], error["line"]) == ("bad.yaml", 6)
        assert "target.precision" in error["message"]
    elif case == "missing_file":
        assert error["kind"] == "usage" and error["line"] is None
        assert error["file"] == (None if command.startswith("cache") else args[0])  # the store is no file
    else:
        assert error["kind"] == "usage" and error["file"] is None and error["line"] is None
        assert "--no-such-option" in error["message"] and "--help" in error["hint"]


def test_without_json_stdout_stays_empty_on_an_error(project, cli):
    project()
    Path("bad.yaml").write_text(BAD_RECIPE)
    code, out, err = cli("run", "bad.yaml")
    assert code == 2 and out == "" and "bad.yaml:6" in err


def test_json_after_a_double_dash_is_an_argument_not_the_option():
    from edgebuild.cli.json_errors import wants_json

    assert wants_json(["run", "r.yaml", "--json"])
    assert not wants_json(["run", "--", "--json"])
    assert not wants_json(["run", "r.yaml"])


def test_an_unexpected_exception_is_an_internal_error_object():
    from edgebuild.cli.json_errors import error_object

    data = error_object(ZeroDivisionError("division by zero"))
    assert data["error"]["kind"] == "internal" and "ZeroDivisionError" in data["error"]["message"]
    assert "--debug" in data["error"]["hint"]


def test_a_plugin_error_keeps_its_kind_and_hint():
    from edgebuild.cli.json_errors import error_object
    from edgebuild.errors import PluginError

    data = error_object(PluginError("plugin 'x' failed to import", hint="fix or uninstall it"))
    assert data["error"] == {"kind": "plugin", "file": None, "line": None, "column": None,
                             "message": "plugin 'x' failed to import", "hint": "fix or uninstall it"}


def test_a_command_that_printed_its_object_before_failing_gets_no_second_one(project, cli, monkeypatch):
    import importlib

    run_module = importlib.import_module("edgebuild.build.run")  # edgebuild.build is also the API's function

    def broken_stamp(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(run_module, "_stamp", broken_stamp)  # the last step, after the JSON is written
    code, out, err = cli("run", project(), "--json")
    assert code == 1 and "internal error" in err
    assert [v["status"] for v in _one_object(out)["variants"]] == ["built"]
