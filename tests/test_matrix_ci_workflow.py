"""examples/ci/github-actions.yml: a workflow GitHub can read, shaped as docs/ci.md says (a Linux
build job with the remote cache, a macOS job after it), whose every ``edgebuild`` command is one
the CLI accepts: each subcommand exists and each option is in its ``--help``.

The remote-cache flags and ``cache pull|status`` are the remote cache's documented contract; on a
build without it this test checks everything else and then skips, naming what it waits for."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / "examples" / "ci" / "github-actions.yml"
REMOTE_CONTRACT = {"--remote", "--no-remote", "--remote-required", "cache pull", "cache push", "cache status"}
SEPARATORS = {"|", "||", "&&", ";", ">", ">>", "(", ")", "<", "&"}


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def steps_of(job: dict) -> list[str]:
    return [step.get("run", "") for step in job["steps"]]


def commands(script: str) -> list[list[str]]:
    """Every ``edgebuild ...`` command in a step's shell script, as its arguments."""
    script = script.replace("\\\n", " ")
    found = []
    for line in script.splitlines():
        if not re.search(r"(^|[\s($|;&])edgebuild\s", line):
            continue  # (the Python snippet names edgebuild.bundle, not the command)
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
        for start in [i for i, token in enumerate(tokens) if token == "edgebuild"]:
            args = []
            for token in tokens[start + 1:]:
                if token in SEPARATORS:
                    break
                args.append(token)
            found.append(args)
    return found


@cache
def help_text(*subcommand: str) -> str | None:
    """``edgebuild SUBCOMMAND --help``, or None when there is no such command."""
    done = subprocess.run([sys.executable, "-m", "edgebuild.cli.app", *subcommand, "--help"], check=False, capture_output=True,
                          text=True, env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"})
    return done.stdout if done.returncode == 0 else None


def test_the_linux_job_builds_with_the_remote_and_keeps_locks_and_reports(workflow):
    assert {"push", "pull_request"} <= set(workflow[True])  # YAML 1.1 reads the key `on` as True
    build = workflow["jobs"]["build"]
    assert build["runs-on"].startswith("ubuntu")
    runs = [args for script in steps_of(build) for args in commands(script)]
    run = next(args for args in runs if args[0] == "run")
    assert "--json" in run and "--remote" in run and any(a.startswith("recipes/") for a in run)
    uploads = [step for step in build["steps"] if str(step.get("uses", "")).startswith("actions/upload-artifact")]
    kept = " ".join(step["with"]["path"] for step in uploads)
    assert "edgebuild.lock.json" in kept and "report.html" in kept and "report.json" in kept


def test_the_macos_job_follows_the_linux_one_pulls_and_verifies(workflow):
    macos = workflow["jobs"]["coreml"]
    assert macos["runs-on"].startswith("macos") and macos["needs"] == "build"
    runs = [args for script in steps_of(macos) for args in commands(script)]
    assert any(args[:2] == ["cache", "pull"] for args in runs)
    verify = next(args for args in runs if args[0] == "verify")
    assert "--reference" in verify


def test_credentials_come_from_secrets_through_the_environment(workflow):
    for name, value in workflow["env"].items():
        if "SECRET" in name or name.endswith("KEY_ID"):
            assert re.fullmatch(r"\$\{\{ secrets\.\w+ \}\}", value), name
    text = WORKFLOW.read_text()
    assert not re.search(r"AKIA[0-9A-Z]{12,}", text)  # no access key written out
    for job in workflow["jobs"].values():
        for script in steps_of(job):
            for args in commands(script):
                assert not any("secret" in a.lower() or "key" in a.lower() for a in args if a.startswith("--"))


def test_every_edgebuild_command_is_one_the_cli_accepts(workflow):
    problems, waiting = [], set()
    for job_name, job in workflow["jobs"].items():
        for script in steps_of(job):
            for args in commands(script):
                subcommand = args[:2] if args[0] == "cache" else args[:1]
                text = help_text(*subcommand)
                where = f"{job_name}: edgebuild {' '.join(args)}"
                if text is None:
                    (waiting.add if " ".join(subcommand) in REMOTE_CONTRACT else problems.append)(
                        " ".join(subcommand) if " ".join(subcommand) in REMOTE_CONTRACT
                        else f"{where}: no command {' '.join(subcommand)!r}")
                    continue
                for option in (a.split("=")[0] for a in args[len(subcommand):] if a.startswith("--")):
                    if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text):
                        if option in REMOTE_CONTRACT:
                            waiting.add(option)
                        else:
                            problems.append(f"{where}: {option} is not an option of edgebuild {' '.join(subcommand)}")
    assert not problems, "\n".join(problems)
    if waiting:
        pytest.skip(f"waits for the remote cache's commands and flags: {', '.join(sorted(waiting))}")


def test_the_command_parser_finds_commands_in_pipes_loops_and_continuations():
    script = ('keys=$(find x -exec jq {} +)\nedgebuild cache pull $keys --remote "$R"\n'
              'jq -r x f | while read -r a b; do\n  edgebuild verify "$b" --reference "m/$a.onnx" --json\ndone\n'
              'edgebuild run r/*.yaml --json \\\n  --report b/i.html > b/run.json\n'
              'python - <<EOF\nfrom edgebuild.bundle.session import InferenceSession\nEOF\n')
    assert commands(script) == [
        ["cache", "pull", "$keys", "--remote", "$R"],
        ["verify", "$b", "--reference", "m/$a.onnx", "--json"],
        ["run", "r/*.yaml", "--json", "--report", "b/i.html"],
    ]
