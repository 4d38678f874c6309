"""Every command that takes a key, a name or a path, given hostile values, in a sandbox with a
victim file and folder beside it: a usage error (exit 2) with a message and no traceback — or,
where the value is a path the user may legitimately name, the command's own success — and in
every case the victims intact, no PWNED file, nothing written outside the sandbox but where the
value itself pointed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgebuild_testplugin.cli_runner import run_in_process

VICTIM_TEXT = "a file edgebuild does not own\n"

# value id -> the value, given the sandbox's parent folder (where the victims are)
VALUES = {
    "victim": lambda outside: str(outside / "victim.txt"),
    "dotdot": lambda outside: "..",
    "empty": lambda outside: "",
    "nul": lambda outside: "x\0y",
    "5000-chars": lambda outside: "x" * 5000,
    "newline": lambda outside: "x\ny",
    "shell": lambda outside: "$(touch PWNED)",
}

# command id -> (argv with {} for the value, the values a user may legitimately give it as a path:
# success (exit 0) is then allowed too, and writing where the value points)
COMMANDS = {
    "cache-pull": (["cache", "pull", "{}", "--remote", "REMOTE"], set()),
    "cache-push": (["cache", "push", "{}", "--remote", "REMOTE"], set()),
    "cache-status": (["cache", "status", "--cache-dir", "{}", "--remote", "REMOTE"], {"dotdot", "empty", "newline", "shell"}),
    "cache-ls": (["cache", "ls", "--cache-dir", "{}"], {"dotdot", "empty", "newline", "shell"}),
    "cache-info": (["cache", "info", "--cache-dir", "{}"], {"dotdot", "empty", "newline", "shell"}),
    "cache-gc": (["cache", "gc", "--cache-dir", "{}"], {"dotdot", "empty", "newline", "shell"}),
    "cache-clear": (["cache", "clear", "--cache-dir", "{}"], {"dotdot", "empty", "newline", "shell"}),
    "run-cache-dir": (["run", "recipe.yaml", "--cache-dir", "{}"], {"dotdot", "empty", "newline", "shell"}),
    "run-depfile": (["run", "recipe.yaml", "--depfile", "{}"], {"newline", "shell"}),
    "run-variant": (["run", "recipe.yaml", "--variant", "{}"], set()),
    "report": (["report", "{}"], {"dotdot", "empty"}),
    "inspect": (["inspect", "{}"], set()),
    "verify": (["verify", "{}", "--reference", "m.onnx"], set()),
    "schema-out": (["schema", "--out", "{}"], {"newline", "shell"}),
    "init-out": (["init", "m.onnx", "-o", "{}"], {"newline", "shell"}),
    # names Core ML refuses (no .mlpackage suffix) but a backend whose artifact has no suffix may write
    "convert-out": (["convert", "m.onnx", "-o", "{}"], {"newline", "shell"}),
}

def rows():
    for command in COMMANDS:
        for value in VALUES:
            yield pytest.param(command, value, id=f"{command}-{value}")


def snapshot(folder: Path, skip: Path) -> dict[str, tuple]:
    """Every path below ``folder`` but ``skip``'s, with its type, size and mtime."""
    seen = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        if Path(dirpath) == skip.parent:
            dirnames[:] = [d for d in dirnames if d != skip.name]
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            seen[str(path.relative_to(folder))] = (st.st_mode >> 12, st.st_size if path.is_file() else 0, st.st_mtime_ns)
    return seen


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """tmp_path/victim.txt and tmp_path/victim-dir/ beside the sandbox tmp_path/sandbox (the
    working directory: a recipe on a tiny model with the test backend, a store, a remote)."""
    from edgebuild_testplugin.models import tiny_model
    from edgebuild_testplugin.recipes import RECIPE

    box = tmp_path / "sandbox"
    box.mkdir()
    tiny_model(box / "m.onnx")
    (box / "recipe.yaml").write_text(RECIPE.format(extra="").replace("tiny.onnx", "m.onnx"))
    (tmp_path / "victim.txt").write_text(VICTIM_TEXT)
    (tmp_path / "victim-dir").mkdir()
    (tmp_path / "victim-dir" / "keep.txt").write_text(VICTIM_TEXT)
    monkeypatch.chdir(box)
    monkeypatch.setenv("EDGEBUILD_CACHE_DIR", str(box / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(box / "no-config"))
    monkeypatch.delenv("EDGEBUILD_REMOTE", raising=False)
    return box


@pytest.mark.parametrize("command, value", list(rows()))
def test_hostile_value(sandbox, capsys, command, value):
    outside = sandbox.parent
    argv, legitimate = COMMANDS[command]
    given = VALUES[value](outside)
    args = [given if a == "{}" else (sandbox / "shared").as_uri() if a == "REMOTE" else a for a in argv]
    before = snapshot(outside, sandbox)
    code, out, err = run_in_process(capsys, *args)
    assert "Traceback" not in err and "internal error" not in err, err
    if value in legitimate:
        assert code in (0, 2), err
    else:
        assert code == 2, f"exit {code}\n{err}"
    assert err.strip() or code == 0  # a refusal says why
    assert (outside / "victim.txt").read_text() == VICTIM_TEXT
    assert (outside / "victim-dir" / "keep.txt").read_text() == VICTIM_TEXT
    assert not list(outside.rglob("PWNED"))
    after = snapshot(outside, sandbox)
    if not (value == "dotdot" and value in legitimate):  # `..` names the folder outside: it may be written
        assert after == before, f"written outside the sandbox: {sorted(set(after.items()) ^ set(before.items()))}"
