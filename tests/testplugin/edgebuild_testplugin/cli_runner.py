"""Running the ``edgebuild`` CLI from a test: in a subprocess as a user would, or in this
process through its own entry point (faster, for exit codes and messages)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest


def edgebuild(*args, env=None, cwd=None, check=None) -> subprocess.CompletedProcess:
    """Run the CLI in a subprocess, as a user would; ``check`` is the exit code to insist on."""
    done = subprocess.run([sys.executable, "-m", "edgebuild.cli.app", *map(str, args)], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, cwd=cwd)
    if check is not None:
        assert done.returncode == check, done.stderr + done.stdout
    return done


def run_in_process(capsys, *args) -> tuple[int, str, str]:
    """``edgebuild ARGS`` through ``edgebuild.cli.app.main`` in this process: (exit code, stdout, stderr)."""
    from edgebuild.cli.app import main

    old = sys.argv
    sys.argv = ["edgebuild", *map(str, args)]
    try:
        with pytest.raises(SystemExit) as done:
            main()
    finally:
        sys.argv = old
    out, err = capsys.readouterr()
    return done.value.code, out, err


def assert_usage_error(code: int, err: str, *phrases: str) -> None:
    """Exit 2 with a message, not a traceback, that holds every one of ``phrases``."""
    assert code == 2, err
    assert "Traceback" not in err and "internal error" not in err, err
    for phrase in phrases:
        assert phrase in err, err


def run_until_stage(recipe: Path, log: Path, stage: str, *, sleep: int) -> subprocess.Popen:
    """``edgebuild run RECIPE`` in the background, the test plugin pausing ``sleep`` s in each
    stage, returned once ``log`` (EDGEBUILD_TEST_LOG) shows ``stage`` has started."""
    env = {**os.environ, "EDGEBUILD_TEST_SLEEP": str(sleep)}
    proc = subprocess.Popen([sys.executable, "-m", "edgebuild.cli.app", "run", str(recipe)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 2 * sleep
    while f"{stage}:start" not in log_lines(log):
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.1)
    return proc


def log_lines(path: Path) -> list[str]:
    """The events the test plugin logged (EDGEBUILD_TEST_LOG), one per stage body run."""
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []
