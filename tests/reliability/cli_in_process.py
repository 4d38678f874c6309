"""The CLI's own entry point run in this process, for tests that check exit codes and messages."""

from __future__ import annotations

import sys

import pytest


def cli(capsys, *args) -> tuple[int, str]:
    """``edgebuild ARGS`` through ``edgebuild.cli.app.main``: its exit code and stderr."""
    from edgebuild.cli.app import main

    old = sys.argv
    sys.argv = ["edgebuild", *map(str, args)]
    try:
        with pytest.raises(SystemExit) as done:
            main()
    finally:
        sys.argv = old
    return done.value.code, capsys.readouterr().err
